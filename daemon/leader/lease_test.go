package leader

import (
	"testing"
	"time"
)

type contacts struct {
	grant   time.Time
	granted bool
	peer    time.Time
}

func (c contacts) LeaseGrant(string) (time.Time, bool) { return c.grant, c.granted }
func (c contacts) PeerContact(string) time.Time        { return c.peer }

// TestLeaseContactCountsGrants: a member that asks for grants is counted
// from the last grant (from the election when it got none in this
// leadership), never from raft's heartbeats, which may be fresher than
// the member's own window (issue 19); an older build is counted from
// raft's heartbeats, as it renews by them.
func TestLeaseContactCountsGrants(t *testing.T) {
	elected := time.Now().Add(-time.Minute)
	granted := time.Now().Add(-3 * time.Second)
	now := time.Now()
	for _, tc := range []struct {
		name       string
		c          contacts
		asksGrants bool
		want       time.Time
	}{
		{"granted in this leadership", contacts{grant: granted, granted: true, peer: now}, false, granted},
		{"asks for grants, none yet", contacts{grant: elected, peer: now}, true, elected},
		{"older build", contacts{grant: elected, peer: now}, false, now},
	} {
		if got := LeaseContact(tc.c, "n2", tc.asksGrants); !got.Equal(tc.want) {
			t.Errorf("%s: lease counted from %s, want %s", tc.name, got, tc.want)
		}
	}
}
