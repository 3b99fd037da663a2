package daemon

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// This member in the replicated state: announcing it (address, voter,
// draining cleared) at start, and handing its partitions to the others
// before it stops.

// handOffAll moves this member's partitions to the others before it stops
// (SIGTERM), when there are others: it marks itself draining, and the
// leader moves its partitions by graceful handoff. A restart clears the
// mark (announce).
func (m *Member) handOffAll(ctx context.Context) {
	others := false
	m.store.Read(func(s *raftstore.State) {
		for id, mem := range s.Members {
			if id != m.cfg.NodeID && !mem.Draining {
				others = true
			}
		}
	})
	if !others {
		return
	}
	// The mark tells the next start that this drain was the member's own,
	// to be lifted then (an operator's drain stays).
	if err := os.WriteFile(filepath.Join(m.cfg.DataDir, drainedOnStop), nil, 0o640); err != nil {
		m.log.Warn("record the shutdown drain", zap.Error(err))
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := m.submit(dctx, raftstore.SetDraining{ID: m.cfg.NodeID, Draining: true})
	cancel()
	if err != nil {
		m.log.Warn("could not start handing off partitions; they are drained and taken over instead", zap.Error(err))
		return
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	changed, stop := m.store.Watch()
	defer stop()
	for {
		n := m.ownedCount()
		if n == 0 {
			m.log.Info("every partition handed off")
			return
		}
		select {
		case <-wctx.Done():
			m.log.Warn("handoff did not finish in time; draining the rest", zap.Int("partitions", n))
			return
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// ownedCount counts the partitions leased to this member that are not
// stopped.
func (m *Member) ownedCount() int {
	n := 0
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner == m.cfg.NodeID && p.State != raftstore.StateStopped {
					n++
				}
			}
		}
	})
	return n
}

// drainedOnStop, in data_dir, marks a drain the member did itself at its
// last shutdown (SIGTERM): the next start lifts it.
const drainedOnStop = "drained-on-stop"

// announce records this member in the state as joined (it runs with
// raft state), with its addresses, and lifts a drain left by its own last
// shutdown. It writes only those fields: a drain an operator asks for
// meanwhile stays.
func (m *Member) announce() {
	self := m.self()
	marker := filepath.Join(m.cfg.DataDir, drainedOnStop)
	_, err := os.Stat(marker)
	undrain := err == nil
	want := raftstore.Member{ID: m.cfg.NodeID, RaftAddr: m.cfg.RaftAdvertise, HTTPAddr: m.AdvertisedHTTP(), Voter: self.IsVoter(), Joined: true}
	for m.ctx.Err() == nil {
		var cur raftstore.Member
		found := false
		m.store.Read(func(s *raftstore.State) {
			if mem, ok := s.Members[m.cfg.NodeID]; ok {
				cur, found = *mem, true
			}
		})
		if found {
			want.Voter = cur.Voter
			want.Draining = cur.Draining && !undrain
			if cur == want {
				if undrain {
					_ = os.Remove(marker)
				}
				return
			}
		}
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		err := m.submit(ctx, raftstore.UpsertMember{Member: want})
		cancel()
		if err != nil {
			m.log.Debug("announce this member to the leader", zap.Error(err))
		}
		// Check again once this member's state has caught up: the record
		// must show, whoever wrote last.
		sleepCtx(m.ctx, time.Second)
	}
}
