package owner

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// renewStore is the raft store as renewals read it: the applied state
// index, the leader, raft's last contact.
type renewStore struct {
	mu      sync.Mutex
	index   uint64
	leader  string
	contact time.Time
}

func (s *renewStore) Read(fn func(*raftstore.State)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(&raftstore.State{Index: s.index})
}
func (s *renewStore) Watch() (<-chan struct{}, func()) { return make(chan struct{}), func() {} }
func (s *renewStore) LeaseContact() time.Time          { return s.contact }
func (s *renewStore) Leader() (string, string)         { return "", s.leader }
func (s *renewStore) Clock() raftstore.Clock           { return raftstore.SystemClock{} }

// grantingMember answers renewals after delay with grant, or err.
type grantingMember struct {
	leaderMember
	delay time.Duration
	grant api.LeaseGrant
	err   error
}

func (m grantingMember) RenewLease(context.Context) (api.LeaseGrant, error) {
	time.Sleep(m.delay)
	return m.grant, m.err
}

// TestRenewalCountsFromItsSendTime: the lease runs from when the renewal
// was sent, so a slow answer shortens it; a grant counts only once the
// state applied the leader's index at the grant; an older-build leader
// (no route) lends raft's contact only while it leads (issue 19).
func TestRenewalCountsFromItsSendTime(t *testing.T) {
	store := &renewStore{index: 5, leader: "n2", contact: time.Now()}
	newOwner := func(m Member) *Owner {
		return New(context.Background(), Config{NodeID: "n1", LeaseTTL: 4 * time.Second, LeaseMargin: 2 * time.Second}, store, nil, m, zaptest.NewLogger(t))
	}

	o := newOwner(grantingMember{delay: 300 * time.Millisecond, grant: api.LeaseGrant{Leader: "n2", StateIndex: 5}})
	before := time.Now()
	o.renewOnce()
	if got := o.leaseContact(); got.Before(before) || got.After(before.Add(100*time.Millisecond)) {
		t.Fatalf("lease counted from %s, want the send time (about %s), not the answer's (300 ms later)", got, before)
	}

	o = newOwner(grantingMember{grant: api.LeaseGrant{Leader: "n2", StateIndex: 9}})
	o.renewOnce()
	if got := o.leaseContact(); !got.IsZero() {
		t.Fatalf("a grant at state index 9 counted at %s while the state applied only 5", got)
	}
	store.mu.Lock()
	store.index = 9
	store.mu.Unlock()
	if got := o.leaseContact(); got.IsZero() {
		t.Fatal("the grant did not count once the state applied its index")
	}

	o = newOwner(grantingMember{err: api.ErrNotFound})
	o.renewOnce()
	if got := o.leaseContact(); !got.Equal(store.contact) || !o.grantLegacy() {
		t.Fatalf("under an older-build leader the lease runs from raft's contact %s, got %s (legacy %v)", store.contact, got, o.grantLegacy())
	}
	store.mu.Lock()
	store.leader = "n3" // a new leader, which may grant
	store.mu.Unlock()
	if got := o.leaseContact(); !got.IsZero() || o.grantLegacy() {
		t.Fatalf("raft's contact still counted (%s) after the older-build leader stopped leading", got)
	}
}
