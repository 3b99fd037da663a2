package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/daemon/leader"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// group is an in-process raft group of members that run only the leader
// loop; the test plays the owners (handoff releases). No Kafka: the leader
// loop needs none once topics are MIRRORING.
type group struct {
	t       testing.TB
	members []*Member
	trans   []*raft.InmemTransport
	// late wraps each member's transport: its answers can be held.
	late []*lateAnswers
	// cut marks a member cut off from the others beyond raft (isolate):
	// its lease renewals and forwarded commands fail too.
	cut []atomic.Bool
	// clocks are the members' clocks (raftstore.Clock): the process
	// clock's rate until a test sets another.
	clocks []*rateClock
	ttl    time.Duration
}

func newGroup(t testing.TB, n int, ttl time.Duration) *group {
	t.Helper()
	return newGroupWith(t, n, ttl, nil)
}

// newGroupWith is newGroup whose members reach the destination cluster
// through dest (nil: none).
func newGroupWith(t testing.TB, n int, ttl time.Duration, dest *kafka.Admin) *group {
	t.Helper()
	g := &group{t: t, ttl: ttl, cut: make([]atomic.Bool, n)}
	logger := zap.NewNop() // benchmarks print everything logged to b
	if tt, ok := t.(*testing.T); ok {
		logger = zaptest.NewLogger(tt)
	}
	addrs := make([]raft.ServerAddress, n)
	for i := range n {
		var tr *raft.InmemTransport
		addrs[i], tr = raft.NewInmemTransportWithTimeout("", 50*time.Millisecond)
		g.trans = append(g.trans, tr)
		g.late = append(g.late, newLateAnswers(tr))
	}
	g.connectAll()
	var peers []raftstore.Server
	for i := range n {
		peers = append(peers, raftstore.Server{ID: fmt.Sprintf("n%d", i+1), Addr: string(addrs[i]), Voter: true})
	}
	for i := range n {
		id := peers[i].ID
		g.clocks = append(g.clocks, newRateClock())
		store, err := raftstore.Open(raftstore.Config{
			NodeID: id, InMemory: true, Transport: g.late[i], Bootstrap: true, Peers: peers, Clock: g.clocks[i],
			HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
			Logger: logger.Named(id),
		})
		if err != nil {
			t.Fatal(err)
		}
		var cfgPeers []config.PeerConfig
		for j, p := range peers {
			cfgPeers = append(cfgPeers, config.PeerConfig{ID: p.ID, Raft: p.Addr, HTTP: fmt.Sprintf("127.0.0.1:%d", 9000+j)})
		}
		m := &Member{cfg: config.Config{NodeID: id, LeaseTTL: ttl, LeaseMargin: ttl / 2, ProduceTimeout: ttl / 4, Peers: cfgPeers}, log: logger.Named(id), dest: dest}
		m.setStore(store)
		m.ctx, m.cancel = context.WithCancel(context.Background())
		m.lead = leader.New(m.ctx, leader.Config{NodeID: id, LeaseTTL: ttl, Peers: cfgPeers}, store, dest, m, m.log)
		m.wireOps()
		m.Go(m.lead.Run)
		g.members = append(g.members, m)
	}
	t.Cleanup(func() {
		for _, m := range g.members {
			g.stop(m)
		}
	})
	return g
}

func (g *group) connectAll() {
	for i := range g.cut {
		g.cut[i].Store(false)
	}
	for i, a := range g.trans {
		for j, b := range g.trans {
			if i != j {
				a.Connect(b.LocalAddr(), b)
			}
		}
	}
}

// isolate cuts member i off from the others: raft, lease renewals and
// forwarded commands.
func (g *group) isolate(i int) {
	g.cut[i].Store(true)
	g.isolateRaft(i)
}

// rejoin connects member i with the others again (raft and the rest).
func (g *group) rejoin(i int) {
	g.cut[i].Store(false)
	for j, tr := range g.trans {
		if j != i {
			tr.Connect(g.trans[i].LocalAddr(), g.trans[i])
			g.trans[i].Connect(tr.LocalAddr(), tr)
		}
	}
}

// isolateRaft cuts member i's raft links alone: its lease renewals and
// forwarded commands still reach the leader (an asymmetric fault: the
// HTTP path up, the raft path down).
func (g *group) isolateRaft(i int) {
	g.trans[i].DisconnectAll()
	for j, tr := range g.trans {
		if j != i {
			tr.Disconnect(g.trans[i].LocalAddr())
		}
	}
}

func (g *group) stop(m *Member) {
	if m.cancel == nil {
		return
	}
	m.cancel()
	m.wg.Wait()
	m.store.Close()
	m.cancel = nil
}

// leader waits for a leader among the running members but those at the
// indexes skip.
func (g *group) leader(skip ...int) *Member {
	g.t.Helper()
	var l *Member
	waitFor(g.t, 10*time.Second, "a leader", func() bool {
		l = g.currentLeader(skip...)
		return l != nil
	})
	return l
}

// currentLeader is the running member that leads now, but those at the
// indexes skip; nil when none does.
func (g *group) currentLeader(skip ...int) *Member {
	for i, m := range g.members {
		if m.cancel != nil && !slices.Contains(skip, i) && m.store.IsLeader() {
			return m
		}
	}
	return nil
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// addTopic records a MIRRORING topic of n partitions with allocated
// producer identities.
func (g *group) addTopic(name string, n int) {
	g.t.Helper()
	l := g.leader()
	ctx := context.Background()
	for _, m := range g.members { // as each member's announce would
		mem := raftstore.Member{ID: m.cfg.NodeID, Voter: true, Joined: true, HTTPAddr: m.Self().HTTP, RaftAddr: m.Self().Raft}
		if err := l.store.Apply(ctx, raftstore.UpsertMember{Member: mem}); err != nil {
			g.t.Fatal(err)
		}
	}
	mirror := raftstore.Mirror{Name: "m", Bootstrap: []string{"src:9092"}}
	if err := l.store.Apply(ctx, raftstore.CreateMirror{Mirror: mirror}); err != nil && !isExists(err) {
		g.t.Fatal(err)
	}
	mt := raftstore.MirrorTopic{Mirror: "m", Topic: name, State: raftstore.StateMirroring}
	for i := range n {
		mt.Partitions = append(mt.Partitions, raftstore.PartitionInfo{State: raftstore.StateMirroring,
			Producer: raftstore.ProducerIdentity{ProducerID: int64(1000 + i), Allocated: true}})
	}
	if err := l.store.Apply(ctx, raftstore.AddTopic{Topic: mt}); err != nil {
		g.t.Fatal(err)
	}
}

func isExists(err error) bool { return errors.Is(err, raftstore.ErrExists) }

// owners reads member i's view of every partition.
func (g *group) partitions(i int) map[raftstore.PartitionKey]raftstore.PartitionInfo {
	out := map[raftstore.PartitionKey]raftstore.PartitionInfo{}
	g.members[i].store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for p, info := range t.Partitions {
				out[raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(p)}] = info
			}
		}
	})
	return out
}

func ownerCounts(parts map[raftstore.PartitionKey]raftstore.PartitionInfo) map[string]int {
	c := map[string]int{}
	for _, p := range parts {
		c[p.Owner]++
	}
	return c
}

func isBalanced(c map[string]int, members ...string) bool {
	total := 0
	for _, n := range c {
		total += n
	}
	if total == 0 {
		return false // the state has no partitions yet
	}
	lo, hi := 1<<30, -1
	for _, id := range members {
		lo, hi = min(lo, c[id]), max(hi, c[id])
	}
	return c[""] == 0 && hi-lo <= 1 && hi >= 0
}

// playOwners releases every partition whose move is requested, as its
// owner would after draining, until ctx ends; it records the largest
// number of handoffs in flight at once.
func (g *group) playOwners(ctx context.Context, maxInFlight *int, mu *sync.Mutex) {
	for ctx.Err() == nil {
		for i, m := range g.members {
			if m.cancel == nil || !m.store.IsLeader() {
				continue
			}
			inFlight := 0
			for k, p := range g.partitions(i) {
				if p.MoveTo == "" {
					continue
				}
				inFlight++
				cp := &raftstore.Checkpoint{SourceOffset: 5, DestinationOffset: 5, Sequence: 3, Producer: p.Producer}
				_ = m.store.Apply(ctx, raftstore.ReleasePartition{Key: k, Lease: raftstore.Lease{Owner: p.Owner, Generation: p.Generation}, Checkpoint: cp})
			}
			mu.Lock()
			*maxInFlight = max(*maxInFlight, inFlight)
			mu.Unlock()
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGroupBalancesAndTakesOver(t *testing.T) {
	g := newGroup(t, 3, 500*time.Millisecond)
	g.addTopic("a", 40)
	g.addTopic("b", 50)
	waitFor(t, 10*time.Second, "90 partitions balanced over n1..n3", func() bool {
		return isBalanced(ownerCounts(g.partitions(0)), "n1", "n2", "n3")
	})
	// A follower is cut off: after the lease TTL (not before) its
	// partitions go to the others, keeping their producer identity.
	l := g.leader()
	victim := 0
	for i, m := range g.members {
		if m != l {
			victim = i
			break
		}
	}
	victimID := g.members[victim].cfg.NodeID
	li := 0
	for i, m := range g.members {
		if m == l {
			li = i
		}
	}
	waitFor(t, 10*time.Second, "the leader's own view balanced", func() bool {
		return isBalanced(ownerCounts(g.partitions(li)), "n1", "n2", "n3")
	})
	before := g.partitions(li)
	cut := time.Now()
	g.isolate(victim)
	var moved time.Time
	waitFor(t, 10*time.Second, victimID+"'s partitions taken over", func() bool {
		c := ownerCounts(g.partitions(li))
		if c[victimID] == 0 {
			moved = time.Now()
			return true
		}
		return false
	})
	// Safety, not speed: the leader never reassigns before the TTL has
	// passed since it last heard from the member (at most one heartbeat
	// before the cut).
	if early := g.ttl - moved.Sub(cut); early > 100*time.Millisecond {
		t.Fatalf("partitions reassigned %s after the cut, %s before the lease TTL", moved.Sub(cut), early)
	}
	after := g.partitions(li)
	for k, p := range before {
		q := after[k]
		switch {
		case p.Owner == victimID:
			if q.Producer != p.Producer || q.Handoff != nil || q.Generation <= p.Generation {
				t.Fatalf("takeover of %s: %+v -> %+v, want the same producer, no handoff, a new generation", k, p, q)
			}
		case q.Owner != p.Owner || q.Generation != p.Generation:
			// A live member's partition moves only by handoff, and the
			// rebalance after the takeover may start some: those keep the
			// owner until the handoff completes.
			t.Fatalf("partition %s of live member %s changed: %+v -> %+v", k, p.Owner, p, q)
		}
	}
	var others []string
	for _, m := range g.members {
		if m.cfg.NodeID != victimID {
			others = append(others, m.cfg.NodeID)
		}
	}
	if c := ownerCounts(after); !isBalanced(c, others...) {
		t.Fatalf("after takeover not balanced over %v: %v", others, c)
	}
}

func TestGroupDrainHandsOffInSteps(t *testing.T) {
	g := newGroup(t, 3, time.Second)
	g.addTopic("a", 60)
	waitFor(t, 10*time.Second, "balanced", func() bool {
		return isBalanced(ownerCounts(g.partitions(0)), "n1", "n2", "n3")
	})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	maxInFlight := 0
	played := make(chan struct{})
	go func() {
		defer close(played)
		g.playOwners(ctx, &maxInFlight, &mu)
	}()
	defer func() {
		cancel()
		<-played
	}()
	l := g.leader()
	before := g.partitions(0)
	if err := l.store.Apply(ctx, raftstore.SetDraining{ID: "n3", Draining: true}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "n3 drained", func() bool {
		c := ownerCounts(g.partitions(0))
		return c["n3"] == 0 && isBalanced(c, "n1", "n2")
	})
	mu.Lock()
	if maxInFlight > leader.MaxMoves {
		t.Fatalf("%d handoffs in flight at once, more than %d", maxInFlight, leader.MaxMoves)
	}
	mu.Unlock()
	for k, p := range g.partitions(0) {
		b := before[k]
		if b.Owner != "n3" {
			continue
		}
		// A handoff keeps the producer identity (no epoch bump) and
		// carries the exact checkpoint, so the new owner does not walk.
		if p.Handoff == nil || p.Producer != b.Producer || p.Owner == "n3" {
			t.Fatalf("partition %s moved off n3 as %+v, want a handoff with producer %+v", k, p, b.Producer)
		}
	}
}

func TestGroupLeaderFailoverKeepsAssignments(t *testing.T) {
	g := newGroup(t, 3, 500*time.Millisecond)
	g.addTopic("a", 30)
	waitFor(t, 10*time.Second, "balanced", func() bool {
		return isBalanced(ownerCounts(g.partitions(0)), "n1", "n2", "n3")
	})
	l := g.leader()
	li := 0
	for i, m := range g.members {
		if m == l {
			li = i
		}
	}
	survivor := (li + 1) % 3
	waitFor(t, 10*time.Second, "the survivor to see the assignment", func() bool {
		return isBalanced(ownerCounts(g.partitions(survivor)), "n1", "n2", "n3")
	})
	before := g.partitions(survivor)
	g.stop(l)
	g.isolate(li)
	g.leader(li)
	dead := l.cfg.NodeID
	waitFor(t, 10*time.Second, "the old leader's partitions reassigned", func() bool {
		return ownerCounts(g.partitions(survivor))[dead] == 0
	})
	for k, p := range g.partitions(survivor) {
		b := before[k]
		if b.Owner != dead && (p.Owner != b.Owner || p.Generation != b.Generation) {
			t.Fatalf("new leader changed %s of live member %s: %+v -> %+v", k, b.Owner, b, p)
		}
	}
}

// TestTakeoverWaitsOutTheMemberLease: during a rolling change of lease_ttl
// the leader runs with 500 ms while a follower announced 3 s (its own file):
// cut off, the follower keeps writing until its own lease_ttl - lease_margin,
// so the leader must not give its partitions away before the follower's
// lease_ttl (issue 19: it took them after its own, and both wrote).
func TestTakeoverWaitsOutTheMemberLease(t *testing.T) {
	g := newGroup(t, 3, 500*time.Millisecond)
	g.addTopic("a", 12)
	l := g.leader()
	li, victim := 0, -1
	for i, m := range g.members {
		if m == l {
			li = i
		} else if victim < 0 {
			victim = i
		}
	}
	victimID := g.members[victim].cfg.NodeID
	waitFor(t, 10*time.Second, "12 partitions balanced in the leader's view", func() bool {
		return isBalanced(ownerCounts(g.partitions(li)), "n1", "n2", "n3")
	})
	const memberTTL = 3 * time.Second
	var rec raftstore.Member
	l.store.Read(func(s *raftstore.State) { rec = *s.Members[victimID] })
	rec.LeaseTTLMs = memberTTL.Milliseconds()
	if err := l.store.Apply(context.Background(), raftstore.UpsertMember{Member: rec}); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	g.isolate(victim)
	var moved time.Time
	waitFor(t, 15*time.Second, victimID+"'s partitions taken over", func() bool {
		if ownerCounts(g.partitions(li))[victimID] == 0 {
			moved = time.Now()
			return true
		}
		return false
	})
	// At most one heartbeat (100 ms) before the cut was the last contact.
	if early := memberTTL - moved.Sub(cut); early > 100*time.Millisecond {
		t.Fatalf("partitions taken over %s after the cut: %s before the member's own lease_ttl (%s) ended", moved.Sub(cut), early, memberTTL)
	}
	t.Logf("taken over %s after the cut (leader lease_ttl %s, member's %s)", moved.Sub(cut).Round(10*time.Millisecond), g.ttl, memberTTL)
}

// A leader that stops hands raft leadership to another voter before it
// closes its API: without it the group has no leader (and no lease
// renewals) until an election by timeout.
func TestStoppingLeaderHandsOverLeadership(t *testing.T) {
	g := newGroup(t, 3, 2*time.Second)
	old := g.leader()
	old.leaveLeadership(context.Background())
	if old.store.IsLeader() {
		t.Fatalf("%s is still the raft leader after leaveLeadership", old.cfg.NodeID)
	}
	// The new leader is one of the others while the old member still runs.
	idx := slices.Index(g.members, old)
	next := g.leader(idx)
	if next == old {
		t.Fatalf("leadership did not move off %s", old.cfg.NodeID)
	}
	// A single-voter group keeps its leader and does not fail.
	solo := newGroup(t, 1, 2*time.Second)
	l := solo.leader()
	l.leaveLeadership(context.Background())
	if !l.store.IsLeader() {
		t.Fatal("a single voter gave up leadership with no one to take it")
	}
}

// A member whose data path cannot start yet does not keep the group's
// leadership: the leader grants leases and runs the leader loop.
func TestStartingMemberYieldsLeadership(t *testing.T) {
	g := newGroup(t, 3, 2*time.Second)
	old := g.leader()
	stop := old.yieldLeadership()
	defer stop()
	waitFor(t, 15*time.Second, "leadership to leave the member that cannot start", func() bool {
		return !old.store.IsLeader() && g.leader() != old
	})
}
