package raftstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// newCluster starts n in-memory stores on raft's in-memory transport:
// node 0 bootstraps, the others join it as voters.
func newCluster(t *testing.T, n int) []*Store {
	t.Helper()
	stores, _ := newClusterTransports(t, n)
	return stores
}

// newClusterTransports is newCluster, also returning each store's
// transport for cutting links.
func newClusterTransports(t *testing.T, n int) ([]*Store, []*raft.InmemTransport) {
	t.Helper()
	addrs := make([]raft.ServerAddress, n)
	trans := make([]*raft.InmemTransport, n)
	for i := range n {
		// A short RPC timeout keeps shutdown fast once peers are gone.
		addrs[i], trans[i] = raft.NewInmemTransportWithTimeout("", 100*time.Millisecond)
	}
	for i := range n {
		for j := range n {
			if i != j {
				trans[i].Connect(addrs[j], trans[j])
			}
		}
	}
	stores := make([]*Store, n)
	for i := range n {
		cfg := fastConfig(t, fmt.Sprintf("n%d", i+1))
		cfg.InMemory, cfg.Transport, cfg.Bootstrap = true, trans[i], i == 0
		stores[i] = mustOpen(t, cfg)
	}
	eventually(t, "n1 to lead", stores[0].IsLeader)
	for i := 1; i < n; i++ {
		if err := stores[0].AddVoter(fmt.Sprintf("n%d", i+1), string(addrs[i])); err != nil {
			t.Fatal(err)
		}
	}
	return stores, trans
}

// TestPreVoteKeepsTheLeader: pre-vote is pinned on (Config in store.go;
// fetch/DESIGN.md section 2): a follower cut off for many election
// timeouts comes back without having raised the term, so the healthy
// leader stays leader and no member loses its lease to a needless
// election. With pre-vote off the returning follower's higher term
// deposes the leader.
func TestPreVoteKeepsTheLeader(t *testing.T) {
	stores, trans := newClusterTransports(t, 3)
	leader := stores[0]
	eventually(t, "n3 to follow n1", func() bool { _, id := stores[2].Leader(); return id == "n1" })
	term := leader.Stats()["term"]
	cut := func(on bool) {
		for i := range 2 {
			if on {
				trans[i].Disconnect(trans[2].LocalAddr())
				trans[2].Disconnect(trans[i].LocalAddr())
			} else {
				trans[i].Connect(trans[2].LocalAddr(), trans[2])
				trans[2].Connect(trans[i].LocalAddr(), trans[i])
			}
		}
	}
	cut(true)
	time.Sleep(time.Second) // 20 election timeouts of fastConfig
	cut(false)
	eventually(t, "n3 to follow n1 again", func() bool {
		_, id := stores[2].Leader()
		return id == "n1" && time.Since(stores[2].LastContact()) < 100*time.Millisecond
	})
	time.Sleep(300 * time.Millisecond)
	if !leader.IsLeader() || leader.Stats()["term"] != term {
		t.Fatalf("after n3 came back: n1 leader %t, term %s (was %s); pre-vote should keep the leader and the term",
			leader.IsLeader(), leader.Stats()["term"], term)
	}
}

func TestClusterReplicates(t *testing.T) {
	ctx := ctxT(t)
	stores := newCluster(t, 3)
	leader, followers := stores[0], stores[1:]

	watch, cancel := followers[0].Watch()
	defer cancel()
	if err := leader.Apply(ctx, CreateMirror{Mirror: Mirror{Name: "m1", Bootstrap: []string{"src:9092"}}}); err != nil {
		t.Fatal(err)
	}
	for i, f := range followers {
		eventually(t, fmt.Sprintf("mirror m1 on follower %d", i+2), func() bool {
			_, ok := storeState(f).Mirrors["m1"]
			return ok
		})
		if err := f.WaitForLeader(ctx); err != nil {
			t.Fatal(err)
		}
		if _, id := f.Leader(); id != "n1" {
			t.Fatalf("follower %d sees leader %q, want n1", i+2, id)
		}
		if f.LastContact().IsZero() {
			t.Fatalf("follower %d never heard from the leader", i+2)
		}
	}
	select {
	case <-watch:
	default:
		t.Fatal("follower watcher not notified of the replicated change")
	}

	err := followers[0].Apply(ctx, CreateMirror{Mirror: Mirror{Name: "m2"}})
	if !errors.Is(err, ErrNotLeader) {
		t.Fatalf("apply on a follower: %v, want ErrNotLeader", err)
	}
	if err := followers[0].VerifyLeader(context.Background()); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("VerifyLeader on a follower: %v, want ErrNotLeader", err)
	}
	if err := followers[0].Barrier(ctx); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("Barrier on a follower: %v, want ErrNotLeader", err)
	}

	// The leader goes away; the other two elect a new one, keep the state
	// and accept writes.
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	var next *Store
	eventually(t, "a new leader", func() bool {
		for _, f := range followers {
			if f.IsLeader() {
				next = f
				return true
			}
		}
		return false
	})
	if err := next.Apply(ctx, CreateMirror{Mirror: Mirror{Name: "m2"}}); err != nil {
		t.Fatalf("apply on the new leader: %v", err)
	}
	for _, f := range followers {
		eventually(t, "m1 and m2 on both survivors", func() bool {
			st := storeState(f)
			return st.Mirrors["m1"] != nil && st.Mirrors["m2"] != nil
		})
	}
}

func TestClusterRemoveServer(t *testing.T) {
	stores := newCluster(t, 3)
	if err := stores[0].RemoveServer("n3"); err != nil {
		t.Fatal(err)
	}
	f := stores[0].raft.GetConfiguration()
	if err := f.Error(); err != nil {
		t.Fatal(err)
	}
	for _, srv := range f.Configuration().Servers {
		if srv.ID == "n3" {
			t.Fatal("n3 still in the raft configuration")
		}
	}
	if err := stores[1].RemoveServer("n2"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("RemoveServer on a follower: %v, want ErrNotLeader", err)
	}
}
