package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// Whether this member may answer: a leader known, this member's state
// caught up with the leader's (a read index), the destination reachable.

// Ready is nil when raft has a leader, this member has applied what it
// knows committed, and the destination cluster answers.
func (m *Member) Ready(ctx context.Context) error {
	if _, id := m.store.Leader(); id == "" {
		return errors.New("raft group has no leader")
	}
	if err := m.CaughtUp(ctx); err != nil {
		return err
	}
	m.readyMu.Lock()
	defer m.readyMu.Unlock()
	if time.Since(m.readyAt) > 5*time.Second {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, m.readyErr = m.dest.ClusterID(cctx)
		cancel()
		m.readyAt = time.Now()
	}
	if m.readyErr != nil {
		return fmt.Errorf("destination cluster unreachable: %v", m.readyErr)
	}
	return nil
}

// CaughtUp is nil when this member's replicated state is current enough to
// answer reads: it is the leader, or it has applied every command the
// leader had applied when asked (a read index: a restarted follower
// applies its log only once the leader tells it the commit index, and
// raft's applied index counts entries handed to the state machine, not
// applied by it).
func (m *Member) CaughtUp(ctx context.Context) error {
	if m.store.IsLeader() {
		return nil
	}
	_, id := m.store.Leader()
	addr := m.memberHTTP(id)
	if id == "" || addr == "" {
		if err := m.notInGroup(); err != nil {
			return err
		}
		return fmt.Errorf("%w: no raft leader is known to this member, so its state may be stale; retry shortly or ask another member", api.ErrNotLeader)
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pr, err := m.auth.ProbePeer(cctx, m.auth.HTTPClient(2*time.Second), addr)
	if err != nil {
		return fmt.Errorf("%w: cannot ask the raft leader %s how far the state goes (%v); retry or ask another member", api.ErrNotLeader, id, err)
	}
	for {
		var applied uint64
		m.store.Read(func(s *raftstore.State) { applied = s.Index })
		if applied >= pr.StateIndex {
			return nil
		}
		select {
		case <-cctx.Done():
			return fmt.Errorf("%w: this member has applied the replicated state to index %d, the leader to %d; retry shortly", api.ErrNotLeader, applied, pr.StateIndex)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
