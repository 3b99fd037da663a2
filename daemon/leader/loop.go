package leader

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/raftstore"
)

// assignChunk bounds the assignments in one raft entry.
const assignChunk = 2000

// Run runs the leader loop while this member is the raft leader
// (Nomad's monitorLeadership shape): raft's notify channel starts it with
// a context that is cancelled when leadership is lost.
func (l *Leader) Run() {
	var lead *leaderTask
	defer lead.stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case leader, ok := <-l.store.Leadership():
			if !ok {
				return
			}
			lead.stop()
			lead = nil
			if leader {
				lead = l.startLeaderTask()
			}
		}
	}
}

// leaderTask is the running leader loop and how to stop it.
type leaderTask struct {
	l      *Leader
	cancel context.CancelFunc
	done   chan struct{}
}

func (l *Leader) startLeaderTask() *leaderTask {
	ctx, cancel := context.WithCancel(l.ctx)
	t := &leaderTask{l: l, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		l.runLeader(ctx)
	}()
	return t
}

// stop cancels the leader loop and waits for it; nil is a no-op.
func (t *leaderTask) stop() {
	if t == nil {
		return
	}
	t.cancel()
	<-t.done
	t.l.log.Info("leader loop stopped")
}

// runLeader waits for a barrier (every earlier entry applied here), then
// reconciles on every state change and every second until ctx ends.
func (l *Leader) runLeader(ctx context.Context) {
	for {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := l.store.Barrier(bctx)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		l.log.Warn("leader barrier failed; retrying", zap.Error(err))
		sleepCtx(ctx, time.Second)
	}
	l.log.Info("leader loop started")
	changed, unwatch := l.store.Watch()
	defer unwatch()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	topicsDone := make(chan struct{})
	go func() {
		defer close(topicsDone)
		l.topicLoop(ctx)
	}()
	defer func() { <-topicsDone }()
	readOnlyDone := make(chan struct{})
	go func() {
		defer close(readOnlyDone)
		l.readOnlyLoop(ctx)
	}()
	defer func() { <-readOnlyDone }()
	lateDone := make(chan struct{})
	go func() {
		defer close(lateDone)
		if l.dest != nil {
			l.lateBatchLoop(ctx)
		}
	}()
	defer func() { <-lateDone }()
	discoveryDone := make(chan struct{})
	go func() {
		defer close(discoveryDone)
		l.discoveryLoop(ctx)
	}()
	defer func() { <-discoveryDone }()
	configSyncDone := make(chan struct{})
	go func() {
		defer close(configSyncDone)
		l.configSyncLoop(ctx)
	}()
	defer func() { <-configSyncDone }()
	settleDone := make(chan struct{})
	go func() {
		defer close(settleDone)
		l.settleLoop(ctx)
	}()
	defer func() { <-settleDone }()
	hooksDone := make(chan struct{})
	go func() {
		defer close(hooksDone)
		l.hookLoop(ctx)
	}()
	defer func() { <-hooksDone }()
	failoverDone := make(chan struct{})
	go func() {
		defer close(failoverDone)
		for ctx.Err() == nil {
			sleepCtx(ctx, failoverCheckInterval)
			views := l.member.Reaches(ctx)
			l.noteProbe(len(views))
			l.noteStuck(views)
			l.checkAutoFailover(ctx, views)
		}
	}()
	defer func() { <-failoverDone }()
	var (
		settled bool      // the last round found nothing to do
		inputs  string    // planInputs then
		at      time.Time // when it ran
	)
	for {
		// A settled round is repeated only when the replicated state
		// changed, or what placement reads besides it (members alive,
		// unproven, stuck), or after settledReconcileEvery: placement runs
		// over every partition, and with 10,000 idle partitions each second
		// was a sixth of the leader's CPU (issue 20).
		in := l.planInputs()
		if !settled || in != inputs || time.Since(at) >= settledReconcileEvery {
			settled = l.leaderReconcile(ctx)
			inputs, at = in, time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			settled = false
		case <-t.C:
		}
	}
}

// settledReconcileEvery is how often a leader round that found nothing to
// do runs again while its inputs are unchanged: a net under what
// planInputs does not show.
const settledReconcileEvery = 10 * time.Second

// fenceTakeovers readies assignments for their raft entry: for each
// member whose partitions they take over, lease grants to it stop
// (Store.BeginTakeover) and its lease is checked once more; a member
// granted a lease since the plan was made keeps its partitions (those
// takeovers are dropped: the next round decides again). end lets grants
// resume, once the entry is applied or failed (a grant after it carries
// a state index that shows the takeover).
func (l *Leader) fenceTakeovers(assign []raftstore.Assignment, alive func(id string) bool) (kept []raftstore.Assignment, end func()) {
	from := map[raftstore.PartitionKey]string{}
	l.store.Read(func(s *raftstore.State) {
		for _, a := range assign {
			if p, ok := s.Partition(a.Key); ok && a.Takeover && p.Generation == a.From && p.Owner != "" {
				from[a.Key] = p.Owner
			}
		}
	})
	var ends []func()
	renewed := map[string]bool{}
	for _, a := range assign {
		id, ok := from[a.Key]
		if !ok {
			kept = append(kept, a)
			continue
		}
		if _, seen := renewed[id]; !seen {
			ends = append(ends, l.store.BeginTakeover(id))
			renewed[id] = alive(id)
			if renewed[id] {
				l.log.Info("member renewed its lease while its partitions were planned for takeover: it keeps them", zap.String("member", id))
			}
		}
		if !renewed[id] {
			kept = append(kept, a)
		}
	}
	return kept, func() {
		for _, end := range ends {
			end()
		}
	}
}

// planInputs describes what a leader round reads besides the replicated
// state: the raft configuration, and for each member (of the state or the
// configuration) whether it is alive, unproven, and stuck on each mirror.
// Two equal descriptions under an unchanged state plan the same.
func (l *Leader) planInputs() string {
	alive, inConfig := l.Alive()
	stuck, unproven := l.stuckNow(), l.unproven()
	var ids, mirrors []string
	l.store.Read(func(s *raftstore.State) {
		for id := range s.Members {
			ids = append(ids, id)
		}
		for name := range s.Mirrors {
			mirrors = append(mirrors, name)
		}
	})
	for id := range inConfig {
		ids = append(ids, "config:"+id)
	}
	sort.Strings(ids)
	sort.Strings(mirrors)
	var b strings.Builder
	for _, id := range ids {
		id = strings.TrimPrefix(id, "config:")
		fmt.Fprintf(&b, "%s:%t", id, alive(id))
		if unproven != nil {
			fmt.Fprintf(&b, ",%t", unproven(id))
		}
		if stuck != nil {
			for _, m := range mirrors {
				fmt.Fprintf(&b, ",%t", stuck(id, m))
			}
		}
		b.WriteByte(';')
	}
	return b.String()
}

// leaderReconcile is one round of leader work: members known, pending
// topics finished, partitions placed.
// It reports whether it found nothing to do (settled).
func (l *Leader) leaderReconcile(ctx context.Context) (settled bool) {
	missed := l.ensureMembers(ctx)
	alive, inConfig := l.Alive()
	stuck, unproven := l.stuckNow(), l.unproven()
	var pending []raftstore.MirrorTopic
	var p Plan
	var gone []string
	l.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.State == raftstore.StatePending {
				pending = append(pending, *t.Clone())
			}
		}
		p = PlanAssignments(s, alive, stuck, unproven)
		gone = removedMembers(s, inConfig)
	})
	settled = !missed && len(gone) == 0 && len(pending) == 0 && len(p.Assign) == 0 && len(p.Moves) == 0
	for _, id := range gone {
		if err := l.store.Apply(ctx, raftstore.RemoveMember{ID: id}); err != nil && ctx.Err() == nil {
			l.log.Warn("forget removed member", zap.String("member", id), zap.Error(err))
		}
	}
	for _, t := range pending {
		l.member.FinishPending(ctx, t)
	}
	for i := 0; i < len(p.Assign); i += assignChunk {
		chunk, end := l.fenceTakeovers(p.Assign[i:min(i+assignChunk, len(p.Assign))], alive)
		var err error
		if len(chunk) > 0 {
			err = l.store.Apply(ctx, raftstore.AssignPartitions{Assignments: chunk})
		}
		end()
		if err != nil && ctx.Err() == nil {
			l.log.Warn("assign partitions", zap.Int("partitions", len(chunk)), zap.Error(err))
			return false
		}
		for _, a := range chunk {
			if a.Takeover {
				l.log.Warn("partition taken over from an unreachable member", zap.Stringer("partition", a.Key), zap.String("to", a.Owner))
			}
		}
	}
	for _, mv := range p.Moves {
		err := l.store.Apply(ctx, mv)
		if err != nil && !errors.Is(err, raftstore.ErrStaleGeneration) && ctx.Err() == nil {
			l.log.Warn("request handoff", zap.Stringer("partition", mv.Key), zap.String("to", mv.To), zap.Error(err))
		}
	}
	return settled
}

// Alive returns whether a member is alive as the leader sees it now:
// in the raft configuration and within its lease (this member, the
// leader, always is): the lease runs the longer of the leader's lease_ttl
// and the one the member announced (TakeoverAfter) from the leader's last
// grant to it (LeaseContact). A member removed from the raft
// configuration is not alive, however recently it was heard from: raft no
// longer sends it heartbeats, so their failures would never show. It also
// returns the IDs in the raft configuration.
func (l *Leader) Alive() (alive func(id string) bool, inConfig map[string]bool) {
	inConfig = map[string]bool{l.cfg.NodeID: true}
	if servers, err := l.store.Servers(); err == nil {
		for _, srv := range servers {
			inConfig[srv.ID] = true
		}
	}
	ttls := map[string]time.Duration{}
	grants := map[string]bool{}
	l.store.Read(func(s *raftstore.State) {
		for id, mem := range s.Members {
			ttls[id] = min(time.Duration(mem.LeaseTTLMs)*time.Millisecond, config.MaxLeaseTTL)
			grants[id] = mem.LeaseProtocol >= raftstore.LeaseProtocolGrant
		}
	})
	clock := l.store.Clock()
	return func(id string) bool {
		if id == l.cfg.NodeID {
			return true
		}
		// The clock is read at every call, after the contact: a time read
		// once when Alive was called would keep a member alive past its
		// lease for as long as the caller kept the closure.
		contact := LeaseContact(l.store, id, grants[id])
		return inConfig[id] && clock.Now().Sub(contact) < TakeoverAfter(l.cfg.LeaseTTL, ttls[id])
	}, inConfig
}

// unproven is PlanAssignments' unproven: the members that ask for lease
// grants and have not asked this leader yet. A record that says a member
// joined is not proof that it runs (issue 18: a record announced for a
// member that never started got partitions, which stood still until its
// lease_ttl after each election). Members of older builds, which ask for
// no grants, are judged by raft's heartbeats (Alive).
func (l *Leader) unproven() func(id string) bool {
	var asking []string
	l.store.Read(func(s *raftstore.State) {
		for id, mem := range s.Members {
			if id != l.cfg.NodeID && mem.LeaseProtocol >= raftstore.LeaseProtocolGrant {
				asking = append(asking, id)
			}
		}
	})
	out := map[string]bool{}
	for _, id := range asking {
		if _, granted := l.store.LeaseGrant(id); !granted {
			out[id] = true
		}
	}
	return func(id string) bool { return out[id] }
}

// ContactStore is what LeaseContact reads of the raft store.
type ContactStore interface {
	LeaseGrant(id string) (at time.Time, granted bool)
	PeerContact(id string) time.Time
}

// LeaseContact is the start of member id's lease as the leader counts it:
// its last grant in this leadership (the leader's election when none) for
// a member that asks for grants (asksGrants: its record says so, or it
// asked this leader), else raft's last heartbeat answer from it (an older
// build, which renews its lease by heartbeats). A member's own window runs
// from when it sent the renewal, before the grant, so it always ends
// first (design.md section 3, issue 19).
func LeaseContact(store ContactStore, id string, asksGrants bool) time.Time {
	at, granted := store.LeaseGrant(id)
	if granted || asksGrants {
		return at
	}
	return store.PeerContact(id)
}

// TakeoverAfter is how long after the leader last heard from a member it
// may give the member's partitions to another: the leader's own lease_ttl
// or the member's announced one (memberTTL; 0: not announced), whichever
// is longer. The member stops writing lease_margin before its own
// lease_ttl (>= produce_timeout + 1 s, validated), so with settings that
// differ between members during a rolling change, its last write is still
// answered before anyone else writes (issue 19).
func TakeoverAfter(leaderTTL, memberTTL time.Duration) time.Duration {
	return max(leaderTTL, memberTTL)
}

// removedMembers lists members of the state that are gone from the raft
// configuration and own no partition any more (theirs were taken over):
// their records are dropped.
func removedMembers(s *raftstore.State, inConfig map[string]bool) []string {
	owns := map[string]bool{}
	for _, t := range s.Topics {
		for _, p := range t.Partitions {
			if p.Owner != "" && p.State != raftstore.StateStopped {
				owns[p.Owner] = true
			}
		}
	}
	var out []string
	for id := range s.Members {
		if !inConfig[id] && !owns[id] {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// ensureMembers records every member of the raft configuration in the
// replicated state, with its HTTP address from the peers list.
// It reports whether it found any missing (or could not read the
// configuration).
func (l *Leader) ensureMembers(ctx context.Context) (missed bool) {
	servers, err := l.store.Servers()
	if err != nil {
		return true
	}
	var missing []raftstore.Member
	l.store.Read(func(s *raftstore.State) {
		for _, srv := range servers {
			if _, ok := s.Members[srv.ID]; !ok {
				mem := raftstore.Member{ID: srv.ID, RaftAddr: srv.Addr, Voter: srv.Voter}
				for _, p := range l.cfg.Peers {
					if p.ID == srv.ID {
						mem.HTTPAddr = p.HTTP
					}
				}
				if srv.ID == l.cfg.NodeID {
					mem.HTTPAddr, mem.Joined = l.member.AdvertisedHTTP(), true
				}
				missing = append(missing, mem)
			}
		}
	})
	for _, mem := range missing {
		// IfAbsent: the member's own announce may have recorded it since.
		if err := l.store.Apply(ctx, raftstore.UpsertMember{Member: mem, IfAbsent: true}); err != nil && ctx.Err() == nil {
			l.log.Warn("record member", zap.String("member", mem.ID), zap.Error(err))
		}
	}
	return len(missing) > 0
}
