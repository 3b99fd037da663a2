package owner

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// This member in the replicated state: announcing it (address, voter,
// draining cleared) at start, and handing its partitions to the others
// before it stops.

// HandOffAll moves this member's partitions to the others before it stops
// (SIGTERM), when there are others: it marks itself draining, and the
// leader moves its partitions by graceful handoff. A restart clears the
// mark (announce).
func (o *Owner) HandOffAll(ctx context.Context) {
	others := false
	o.store.Read(func(s *raftstore.State) {
		for id, mem := range s.Members {
			if id != o.cfg.NodeID && !mem.Draining {
				others = true
			}
		}
	})
	if !others {
		return
	}
	// The mark tells the next start that this drain was the member's own,
	// to be lifted then (an operator's drain stays).
	if err := os.WriteFile(filepath.Join(o.cfg.DataDir, drainedOnStop), nil, 0o640); err != nil {
		o.log.Warn("record the shutdown drain", zap.Error(err))
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := o.member.Submit(dctx, raftstore.SetDraining{ID: o.cfg.NodeID, Draining: true})
	cancel()
	if err != nil {
		o.log.Warn("could not start handing off partitions; they are drained and taken over instead", zap.Error(err))
		return
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	changed, stop := o.store.Watch()
	defer stop()
	for {
		n := o.ownedCount()
		if n == 0 {
			o.log.Info("every partition handed off")
			return
		}
		select {
		case <-wctx.Done():
			o.log.Warn("handoff did not finish in time; draining the rest", zap.Int("partitions", n))
			return
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// ownedCount counts the partitions leased to this member that are not
// stopped.
func (o *Owner) ownedCount() int {
	n := 0
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner == o.cfg.NodeID && p.State != raftstore.StateStopped {
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
func (o *Owner) announce() {
	self := o.member.Self()
	marker := filepath.Join(o.cfg.DataDir, drainedOnStop)
	_, err := os.Stat(marker)
	undrain := err == nil
	want := raftstore.Member{ID: o.cfg.NodeID, RaftAddr: o.cfg.RaftAdvertise, HTTPAddr: o.member.AdvertisedHTTP(), Voter: self.IsVoter(), Joined: true,
		LeaseTTLMs: o.cfg.LeaseTTL.Milliseconds(), LeaseProtocol: raftstore.LeaseProtocolGrant}
	for o.ctx.Err() == nil {
		var cur raftstore.Member
		found := false
		o.store.Read(func(s *raftstore.State) {
			if mem, ok := s.Members[o.cfg.NodeID]; ok {
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
		ctx, cancel := context.WithTimeout(o.ctx, 5*time.Second)
		err := o.member.Submit(ctx, raftstore.UpsertMember{Member: want})
		cancel()
		switch {
		case errors.Is(err, api.ErrInvalid):
			o.log.Warn("the leader refused this member's record", zap.Error(err))
		case err != nil:
			o.log.Debug("announce this member to the leader", zap.Error(err))
		}
		// Check again once this member's state has caught up: the record
		// must show, whoever wrote last.
		sleepCtx(o.ctx, time.Second)
	}
}
