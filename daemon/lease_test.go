package daemon

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/daemon/owner"
	"github.com/kmirror/kmirror/raftstore"
)

// lateAnswers is a member's raft transport whose answers to the others'
// requests can be held (a link slow in one direction): the member
// processes each request at once, so raft stamps its contact with the
// leader, but the leader gets the answer late or, past its transport
// timeout, never.
type lateAnswers struct {
	*raft.InmemTransport
	delay atomic.Int64 // nanoseconds
	// laggard refuses the leader's log entries (and snapshots) while it
	// is set, and takes its heartbeats: the member knows the leader and
	// stays behind it, as a follower whose catch-up is slow does.
	laggard atomic.Bool
	// loss is the share of messages lost, in thousandths: a request to
	// this member never reaches it, or its answer never reaches the
	// sender (each half the time), and the same for its renewals and
	// forwarded commands (carryInProcess): a lossy link.
	loss atomic.Int64
	// rng draws the losses; seeded from the tier's schedule seed, so a
	// replay loses the same share in the same order of draws.
	rngMu sync.Mutex
	rng   *mrand.Rand
	out   chan raft.RPC
	done  chan struct{}
}

// emptyResponse is a zero answer of the type raft's transport expects for
// cmd, sent with an error for a lost request.
func emptyResponse(cmd any) any {
	switch cmd.(type) {
	case *raft.AppendEntriesRequest:
		return &raft.AppendEntriesResponse{}
	case *raft.RequestVoteRequest:
		return &raft.RequestVoteResponse{}
	case *raft.RequestPreVoteRequest:
		return &raft.RequestPreVoteResponse{}
	case *raft.InstallSnapshotRequest:
		return &raft.InstallSnapshotResponse{}
	case *raft.TimeoutNowRequest:
		return &raft.TimeoutNowResponse{}
	}
	return nil
}

// lost draws whether one message on l's link is lost.
func (l *lateAnswers) lost() bool {
	p := l.loss.Load()
	return p > 0 && l.draw(1000) < p
}

// draw is a number in [0, n) from the link's own generator.
func (l *lateAnswers) draw(n int64) int64 {
	l.rngMu.Lock()
	defer l.rngMu.Unlock()
	return l.rng.Int64N(n)
}

// seed restarts the link's generator from the schedule's seed and the
// member's index.
func (l *lateAnswers) seed(seed int64, member int) {
	l.rngMu.Lock()
	defer l.rngMu.Unlock()
	l.rng = mrand.New(mrand.NewPCG(uint64(seed), uint64(member)))
}

func newLateAnswers(tr *raft.InmemTransport) *lateAnswers {
	l := &lateAnswers{InmemTransport: tr, rng: mrand.New(mrand.NewPCG(mrand.Uint64(), 0)), out: make(chan raft.RPC), done: make(chan struct{})}
	go l.relay()
	return l
}

// The member's own requests cross its lossy link too: a lossy leader
// loses its heartbeats and log entries, not only the requests it is sent.
// Replication goes without a pipeline, so each of its requests is drawn.

var errSentLost = errors.New("request lost on a lossy link (sent)")

// send makes one of the member's own requests, unless the link loses it:
// then the sender hears nothing for the transport's timeout (the 50 ms
// newGroupWith gives raft's in-memory transport) and fails.
func (l *lateAnswers) send(call func() error) error {
	if l.lost() {
		time.Sleep(50 * time.Millisecond)
		return errSentLost
	}
	return call()
}

func (l *lateAnswers) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}

func (l *lateAnswers) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	return l.send(func() error { return l.InmemTransport.AppendEntries(id, target, args, resp) })
}

func (l *lateAnswers) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	return l.send(func() error { return l.InmemTransport.RequestVote(id, target, args, resp) })
}

func (l *lateAnswers) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	return l.send(func() error { return l.InmemTransport.RequestPreVote(id, target, args, resp) })
}

func (l *lateAnswers) TimeoutNow(id raft.ServerID, target raft.ServerAddress, args *raft.TimeoutNowRequest, resp *raft.TimeoutNowResponse) error {
	return l.send(func() error { return l.InmemTransport.TimeoutNow(id, target, args, resp) })
}

func (l *lateAnswers) Consumer() <-chan raft.RPC { return l.out }

func (l *lateAnswers) Close() error {
	select {
	case <-l.done:
	default:
		close(l.done)
	}
	return l.InmemTransport.Close()
}

func (l *lateAnswers) relay() {
	in := l.InmemTransport.Consumer()
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-l.done:
			return
		}
		if l.lost() {
			if l.draw(2) == 0 { // the request is lost
				rpc.Respond(emptyResponse(rpc.Command), errors.New("request lost on a lossy link"))
				continue
			}
			// The answer is lost: the member acts on the request, the
			// sender hears nothing of it.
			orig, swallowed := rpc.RespChan, make(chan raft.RPCResponse, 1)
			rpc.RespChan = swallowed
			go func() {
				select {
				case r := <-swallowed:
					orig <- raft.RPCResponse{Response: r.Response, Error: errors.New("answer lost on a lossy link")}
				case <-l.done:
				}
			}()
		}
		if l.laggard.Load() {
			refused := errors.New("log entries refused: a lagging follower")
			if ae, ok := rpc.Command.(*raft.AppendEntriesRequest); ok && len(ae.Entries) > 0 {
				rpc.Respond(&raft.AppendEntriesResponse{Term: ae.Term}, refused)
				continue
			}
			if is, ok := rpc.Command.(*raft.InstallSnapshotRequest); ok {
				rpc.Respond(&raft.InstallSnapshotResponse{Term: is.Term}, refused)
				continue
			}
		}
		if d := time.Duration(l.delay.Load()); d > 0 {
			orig, held := rpc.RespChan, make(chan raft.RPCResponse, 1)
			rpc.RespChan = held
			go func() {
				select {
				case r := <-held:
					select {
					case <-time.After(d):
						orig <- r // buffered by the sender
					case <-l.done:
					}
				case <-l.done:
				}
			}()
		}
		select {
		case l.out <- rpc:
		case <-l.done:
			return
		}
	}
}

// carryInProcess routes every member's lease renewals and forwarded
// commands straight to the named leader's handler, as its HTTP API would,
// over the same faults as its raft link: a member cut off (isolate)
// reaches no one and no one reaches it, a member whose raft answers are
// held sends its requests that much later, and a leader whose raft
// answers are held answers a renewal that much later (a link slow in one
// direction).
func (g *group) carryInProcess() {
	byID, index := map[string]*Member{}, map[string]int{}
	for i, m := range g.members {
		byID[m.cfg.NodeID], index[m.cfg.NodeID] = m, i
	}
	link := func(ctx context.Context, self, leaderID string) (*Member, error) {
		l, ok := byID[leaderID]
		if !ok {
			return nil, fmt.Errorf("%w: no leader known", api.ErrNotLeader)
		}
		if g.cut[index[self]].Load() || g.cut[index[leaderID]].Load() {
			return nil, fmt.Errorf("%s cannot reach %s: cut off", self, leaderID)
		}
		if g.late[index[self]].lost() || g.late[index[leaderID]].lost() {
			return nil, fmt.Errorf("%s to %s: request lost on a lossy link", self, leaderID)
		}
		if d := time.Duration(g.late[index[self]].delay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return l, nil
	}
	for _, m := range g.members {
		self := m.cfg.NodeID
		m.leaseVia = func(ctx context.Context, leaderID string) (api.LeaseGrant, error) {
			l, err := link(ctx, self, leaderID)
			if err != nil {
				return api.LeaseGrant{}, err
			}
			grant, err := l.grantLease(ctx, self)
			if err == nil && (g.late[index[leaderID]].lost() || g.late[index[self]].lost()) {
				// Granted and recorded by the leader; the member never
				// hears of it.
				return api.LeaseGrant{}, fmt.Errorf("%s to %s: answer lost on a lossy link", leaderID, self)
			}
			// The answer crosses the leader's side of the link: held
			// as long as the leader's raft answers are.
			if d := time.Duration(g.late[index[leaderID]].delay.Load()); d > 0 && err == nil {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return api.LeaseGrant{}, ctx.Err()
				}
			}
			return grant, err
		}
		m.applyVia = func(ctx context.Context, leaderID string, entry []byte) error {
			l, err := link(ctx, self, leaderID)
			if err != nil {
				return err
			}
			return l.ApplyInternal(api.WithCaller(ctx, api.Caller{Member: self}), entry)
		}
	}
}

// runLeases runs every member's lease (renewals and self-fencing) with
// renewals carried in process, and records each member's lease settings
// and protocol as its announce would.
func (g *group) runLeases() {
	g.t.Helper()
	g.carryInProcess()
	for _, m := range g.members {
		self := m.cfg.NodeID
		m.own = owner.New(m.ctx, owner.Config{NodeID: self, LeaseTTL: m.cfg.LeaseTTL, LeaseMargin: m.cfg.LeaseMargin}, m.store, nil, m, m.log.Named("owner"))
		m.own.RunLease()
		g.t.Cleanup(m.own.StopLease)
	}
	l := g.leader()
	for _, m := range g.members {
		rec := raftstore.Member{ID: m.cfg.NodeID, Voter: true, Joined: true, HTTPAddr: m.Self().HTTP, RaftAddr: m.Self().Raft,
			LeaseTTLMs: m.cfg.LeaseTTL.Milliseconds(), LeaseProtocol: raftstore.LeaseProtocolGrant}
		if err := l.store.Apply(context.Background(), raftstore.UpsertMember{Member: rec}); err != nil {
			g.t.Fatal(err)
		}
	}
	waitFor(g.t, 10*time.Second, "every member holding its lease", func() bool {
		for _, m := range g.members {
			if m.own.WriteDeadline().IsZero() {
				return false
			}
		}
		return true
	})
}

// TestLeaseEndsBeforeTakeoverWhenRaftAnswersAreLate: a member's raft
// answers are held past the leader's transport timeout on a live link.
// It keeps processing the leader's heartbeats, so raft's contact stays
// fresh on its side, while the leader's heartbeats to it fail and the
// leader gives its partitions away lease_ttl later. The member's lease
// must end before that (issue 19: it ran from raft's contact and never
// ended), and come back once its answers do.
func TestLeaseEndsBeforeTakeoverWhenRaftAnswersAreLate(t *testing.T) {
	g := newGroup(t, 3, 2*time.Second)
	g.addTopic("a", 6)
	g.runLeases()
	l := g.leader()
	victim := -1
	for i, m := range g.members {
		if m != l && victim < 0 {
			victim = i
		}
	}
	v := g.members[victim]
	vid := v.cfg.NodeID
	held := time.Now()
	g.late[victim].delay.Store(int64(3 * time.Second))

	var takeover, fenced time.Time
	waitFor(t, 6*g.ttl, "the leader taking "+vid+"'s partitions over and "+vid+" fenced", func() bool {
		now := time.Now()
		alive, _ := l.lead.Alive()
		dl := v.own.WriteDeadline()
		if dl.IsZero() && fenced.IsZero() {
			fenced = now
		}
		if !alive(vid) {
			if takeover.IsZero() {
				takeover = now
			}
			if dl.After(now) {
				t.Fatalf("the leader may give %s's partitions away (%s after its answers were held) while %s may write until %s later",
					vid, now.Sub(held).Round(time.Millisecond), vid, dl.Sub(now).Round(time.Millisecond))
			}
		}
		return !takeover.IsZero() && !fenced.IsZero()
	})
	t.Logf("%s fenced %s after its raft answers were held; the leader could take over %s after", vid,
		fenced.Sub(held).Round(10*time.Millisecond), takeover.Sub(held).Round(10*time.Millisecond))
	if !fenced.Before(takeover) {
		t.Fatalf("%s fenced at %s, not before the takeover at %s", vid, fenced, takeover)
	}
	waitFor(t, 6*g.ttl, vid+"'s partitions moved to the others", func() bool {
		return ownerCounts(g.partitions(0))[vid] == 0
	})

	g.late[victim].delay.Store(0)
	waitFor(t, 6*g.ttl, vid+" holding a lease again once its answers arrive", func() bool {
		alive, _ := l.lead.Alive()
		return alive(vid) && !v.own.WriteDeadline().IsZero()
	})
}

// TestGrantLeaseRefusals: only the leader grants, only to members of the
// raft configuration, and only while raft heartbeats to the member
// succeed; a grant is recorded for the takeover.
func TestGrantLeaseRefusals(t *testing.T) {
	g := newGroup(t, 3, 2*time.Second)
	l := g.leader()
	ctx := context.Background()
	var follower *Member
	fi := -1
	for i, m := range g.members {
		if m != l && follower == nil {
			follower, fi = m, i
		}
	}
	if _, err := follower.grantLease(ctx, l.cfg.NodeID); !errors.Is(err, api.ErrNotLeader) {
		t.Fatalf("a follower granted a lease: %v", err)
	}
	if _, err := l.grantLease(ctx, "n9"); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("a lease granted to a member outside the raft configuration: %v", err)
	}
	before := time.Now()
	// A new leader grants nothing until it has applied the entries of
	// earlier terms (its barrier; TestNoGrantBeforeTheLeaderCaughtUp).
	var err error
	waitFor(t, 5*time.Second, "the new leader past its barrier", func() bool {
		_, err = l.grantLease(ctx, follower.cfg.NodeID)
		return !errors.Is(err, api.ErrUnavailable) || !strings.Contains(err.Error(), "barrier")
	})
	if err != nil {
		t.Fatal(err)
	}
	if at, granted := l.store.LeaseGrant(follower.cfg.NodeID); !granted || at.Before(before) {
		t.Fatalf("grant not recorded: %s %v", at, granted)
	}
	g.late[fi].delay.Store(int64(time.Second))
	waitFor(t, 5*time.Second, "heartbeats to "+follower.cfg.NodeID+" failing", func() bool { return l.store.PeerFailing(follower.cfg.NodeID) })
	if _, err := l.grantLease(ctx, follower.cfg.NodeID); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a lease granted while heartbeats to the member fail: %v", err)
	}
}

// TestNoGrantBeforeTheLeaderCaughtUp: a new leader grants no lease (its
// own included) until it has applied every entry of earlier terms (its
// barrier): the state index of a grant before that could miss a move an
// earlier leader committed, and the member would count its grant while
// its state still shows the partition (issue 19 review).
func TestNoGrantBeforeTheLeaderCaughtUp(t *testing.T) {
	_, tr := raft.NewInmemTransport("")
	store, err := raftstore.Open(raftstore.Config{
		NodeID: "n1", InMemory: true, Transport: tr, Bootstrap: true,
		Peers:            []raftstore.Server{{ID: "n1", Addr: string(tr.LocalAddr()), Voter: true}},
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m := &Member{cfg: config.Config{NodeID: "n1"}, log: zap.NewNop()}
	m.setStore(store)
	waitFor(t, 10*time.Second, "n1 leading", store.IsLeader)
	ctx := context.Background()
	if _, err := m.grantLease(ctx, "n1"); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("a lease granted before the leader's barrier: %v", err)
	}
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := store.Barrier(bctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.grantLease(ctx, "n1"); err != nil {
		t.Fatalf("no lease after the leader's barrier: %v", err)
	}
}

// TestIsolatedLeaderGrantsNoLease: a leader cut off from the others still
// calls itself leader until raft steps it down (LeaderLeaseTimeout); in
// that time it must grant no lease, its own included: a quorum must
// confirm its leadership after the renewal arrived (VerifyLeader), or a
// leader frozen past an election would grant on a state that no longer
// holds (issue 19 review).
func TestIsolatedLeaderGrantsNoLease(t *testing.T) {
	g := newGroup(t, 3, 2*time.Second)
	l := g.leader()
	li := g.index(l)
	waitFor(t, 10*time.Second, "the leader caught up", l.store.LeaderCaughtUp)
	g.isolateRaft(li)
	// A heartbeat in flight at the cut may still come back and confirm
	// the leadership it was sent under (raft counts it for a verify
	// registered while it flew; seen once in CI): ask once it has ended
	// (the in-memory transport's timeout is 50 ms).
	time.Sleep(60 * time.Millisecond)
	if !l.store.IsLeader() {
		t.Skip("raft stepped the leader down before the test could ask it: nothing checked")
	}
	if _, err := l.grantLease(context.Background(), l.cfg.NodeID); err == nil {
		t.Fatal("a leader cut off from every other voter granted a lease")
	}
}
