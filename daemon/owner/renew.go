package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// grantState is this member's lease as the raft leader granted it
// (design.md section 3, issue 19). The member asks for it (renewLoop);
// its lease runs lease_ttl - lease_margin from the moment it sent the
// last answered renewal, so any delay on the way there or back shortens
// it, while the leader takes the member's partitions over lease_ttl after
// it last granted one (leader.Alive).
type grantState struct {
	mu sync.Mutex
	// start is the send time of the last renewal counted.
	start time.Time
	// pendingStart is the send time of a renewal answered with a state
	// index this member had not applied yet: it counts once it has.
	pendingStart time.Time
	pendingIndex uint64
	// legacyLeader is a leader of an older build, which answered that it
	// has no lease route: while it leads, raft's last contact with it
	// counts, as it counts raft's heartbeats to take over.
	legacyLeader string
	// failing: the last renewal failed (logged once per change).
	failing bool
}

// renewEvery is how often a member asks for its lease: five times a
// window, at most once a second and at least every 50 ms.
func (o *Owner) renewEvery() time.Duration {
	return min(max(o.leaseWindow()/5, 50*time.Millisecond), time.Second)
}

// leaseContact is the start of this member's current write window.
func (o *Owner) leaseContact() time.Time {
	g := &o.grant
	g.mu.Lock()
	pending := g.pendingStart.After(g.start)
	g.mu.Unlock()
	// The state's index is read only while a grant waits for it: the data
	// path asks for the lease on every produce and checkpoint, and the
	// state's read lock is the control plane's.
	var idx uint64
	if pending {
		idx = o.stateIndex()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if pending && g.pendingStart.After(g.start) && idx >= g.pendingIndex {
		g.start = g.pendingStart
	}
	if g.legacyLeader != "" {
		if _, id := o.store.Leader(); id == g.legacyLeader {
			return o.store.LeaseContact()
		}
	}
	return g.start
}

// grantLegacy reports whether the raft leader is of an older build that
// grants no leases.
func (o *Owner) grantLegacy() bool {
	o.grant.mu.Lock()
	legacy := o.grant.legacyLeader
	o.grant.mu.Unlock()
	if legacy == "" {
		return false
	}
	_, id := o.store.Leader()
	return id == legacy
}

func (o *Owner) stateIndex() uint64 {
	var idx uint64
	o.store.Read(func(s *raftstore.State) { idx = s.Index })
	return idx
}

// renewLoop asks the leader for this member's lease every renewEvery until
// the lease loop ends.
func (o *Owner) renewLoop() {
	t := time.NewTicker(o.renewEvery())
	defer t.Stop()
	for {
		o.waitUnpaused()
		o.renewOnce()
		select {
		case <-o.leaseCtx.Done():
			return
		case <-t.C:
		}
	}
}

// renewOnce sends one renewal and records its answer. A renewal that takes
// longer than the window is abandoned: its grant would end before it came.
func (o *Owner) renewOnce() {
	_, leaderID := o.store.Leader()
	sent := o.store.Clock().Now()
	ctx, cancel := context.WithTimeout(o.leaseCtx, o.leaseWindow())
	grant, err := o.member.RenewLease(ctx)
	cancel()
	g := &o.grant
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case err == nil:
		g.legacyLeader = ""
		if sent.After(g.pendingStart) {
			g.pendingStart, g.pendingIndex = sent, grant.StateIndex
		}
	case errors.Is(err, api.ErrNotFound) && leaderID != "":
		if g.legacyLeader != leaderID {
			o.log.Info("the raft leader runs an older kmirror without lease grants: this member's lease follows raft's heartbeats while it leads",
				zap.String("leader", leaderID))
		}
		g.legacyLeader = leaderID
	}
	switch {
	case err != nil && !g.failing && o.leaseCtx.Err() == nil && !errors.Is(err, api.ErrNotFound) && !g.start.IsZero():
		// (Before the first grant, at start, the group may still be forming.)
		o.log.Warn("lease renewal failed; this member stops writing lease_ttl - lease_margin after the last renewal it sent that was granted",
			zap.Error(err))
		g.failing = true
	case err == nil && g.failing:
		o.log.Info("lease renewal granted again", zap.String("leader", grant.Leader))
		g.failing = false
	}
}
