package leader

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestNoteStuckDestination: a member the destination has not answered for
// lease_ttl while it answers another member is stuck for every mirror; one
// not answered for less, or when the destination answers nobody (moving
// would not help), is not; a source stall stays per mirror.
func TestNoteStuckDestination(t *testing.T) {
	ttl := 6 * time.Second
	l := &Leader{cfg: Config{LeaseTTL: ttl}, log: zaptest.NewLogger(t)}
	down := func(d time.Duration) api.DestinationReach {
		return api.DestinationReach{UnreachableMs: d.Milliseconds(), Error: "produce unanswered"}
	}
	src := func(mirror string, d time.Duration) []api.SourceReach {
		return []api.SourceReach{{Mirror: mirror, UnreachableMs: d.Milliseconds()}}
	}
	for _, tc := range []struct {
		name  string
		views map[string]api.Reach
		stuck map[[2]string]bool // (member, mirror) pairs that are stuck
	}{
		{"destination stalled for one member", map[string]api.Reach{
			"a": {Destination: down(ttl)}, "b": {}, "c": {Destination: down(ttl - time.Millisecond)},
		}, map[[2]string]bool{{"a", "m1"}: true, {"a", "m2"}: true}},
		{"destination answers nobody", map[string]api.Reach{
			"a": {Destination: down(time.Minute)}, "b": {Destination: down(time.Minute)},
		}, nil},
		{"source stalled for one member", map[string]api.Reach{
			"a": {Sources: src("m1", ttl)}, "b": {Sources: src("m1", 0)},
		}, map[[2]string]bool{{"a", "m1"}: true}},
		{"all answer", map[string]api.Reach{"a": {}, "b": {}}, nil},
	} {
		l.noteStuck(tc.views)
		isStuck := l.stuckNow()
		if (isStuck == nil) != (len(tc.stuck) == 0) {
			t.Fatalf("%s: stuckNow nil %t, want %t", tc.name, isStuck == nil, len(tc.stuck) == 0)
		}
		if isStuck == nil {
			continue
		}
		for _, member := range []string{"a", "b", "c"} {
			for _, mirror := range []string{"m1", "m2"} {
				if got, want := isStuck(member, mirror), tc.stuck[[2]string{member, mirror}]; got != want {
					t.Errorf("%s: stuck(%s, %s) = %t, want %t", tc.name, member, mirror, got, want)
				}
			}
		}
	}
}
