package leader

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// inputsStore is a Store whose state and lease grants a test sets.
type inputsStore struct {
	Store // unused methods panic
	mu    sync.Mutex
	state *raftstore.State
	grant map[string]time.Time
}

func (s *inputsStore) Read(f func(*raftstore.State)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.state)
}

func (s *inputsStore) Servers() ([]raftstore.Server, error) {
	return []raftstore.Server{{ID: "n1", Voter: true}, {ID: "n2", Voter: true}}, nil
}

func (s *inputsStore) LeaseGrant(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.grant[id]
	return at, ok
}

func (s *inputsStore) PeerContact(string) time.Time { return time.Now() }
func (s *inputsStore) Clock() raftstore.Clock       { return raftstore.SystemClock{} }

// TestPlanInputsShowAMemberExpiring: a settled leader round is repeated
// only when planInputs changes (or the state does), so what placement
// reads besides the state must show in it: a member whose lease ran out
// with no change to the state (it was cut off) changes the inputs, and
// its takeover is planned in the next second rather than at the 10 s net.
func TestPlanInputsShowAMemberExpiring(t *testing.T) {
	st := &raftstore.State{Members: map[string]*raftstore.Member{
		"n1": {ID: "n1", Joined: true, LeaseTTLMs: 3000, LeaseProtocol: raftstore.LeaseProtocolGrant},
		"n2": {ID: "n2", Joined: true, LeaseTTLMs: 3000, LeaseProtocol: raftstore.LeaseProtocolGrant},
	}, Mirrors: map[string]*raftstore.Mirror{"m": {Name: "m"}}}
	store := &inputsStore{state: st, grant: map[string]time.Time{"n2": time.Now()}}
	l := New(context.Background(), Config{NodeID: "n1", LeaseTTL: 3 * time.Second}, store, nil, nil, zap.NewNop())
	fresh := l.planInputs()
	if again := l.planInputs(); again != fresh {
		t.Fatalf("nothing changed, but the inputs did: %q then %q", fresh, again)
	}
	store.mu.Lock()
	store.grant["n2"] = time.Now().Add(-4 * time.Second) // its lease ran out
	store.mu.Unlock()
	if expired := l.planInputs(); expired == fresh {
		t.Fatalf("n2's lease ran out and the inputs stayed %q: its takeover would wait for the 10 s net", fresh)
	}
}
