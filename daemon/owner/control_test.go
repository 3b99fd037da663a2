package owner

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// TestReportAfterLateFailure: a partition fails and recovers while its
// FAILED report is still being applied. This member's copy of the state
// does not show FAILED yet when the recovery is reported, so that copy alone
// would call the MIRRORING report already told; the FAILED report then lands
// and describe would show FAILED for good for a partition that mirrors
// (seen on a loaded machine: TestGroupTakeoverConnections). The recovery
// must reach the replicated state after the failure does.
func TestReportAfterLateFailure(t *testing.T) {
	o, store, key := ownedPartition(t)
	c := &control{o: o}
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}
	gen := partitionOf(store, key).Generation

	c.Report(k, gen, fetch.Failed, "fetch from destination cluster t/0: kafka error 6", 0)
	o.out.mu.Lock()
	inFlight := o.out.cmds["state "+k.String()].cmd // what flush is submitting
	o.out.mu.Unlock()
	if inFlight == nil {
		t.Fatal("the FAILED report was not put in the outbox")
	}
	c.Report(k, gen, fetch.Mirroring, "", 0) // the local state still shows MIRRORING
	if err := store.Apply(context.Background(), inFlight); err != nil {
		t.Fatal(err)
	}
	o.out.flush()
	if got := partitionOf(store, key); got.State != raftstore.StateMirroring || got.Reason != "" {
		t.Fatalf("after the late FAILED report and the recovery, the replicated state shows %s %q; want MIRRORING", got.State, got.Reason)
	}

	// A report that says what the replicated state and the last report say
	// already is not sent again.
	c.Report(k, gen, fetch.Mirroring, "", 0)
	o.out.mu.Lock()
	waiting := len(o.out.cmds)
	o.out.mu.Unlock()
	if waiting != 0 {
		t.Fatalf("%d commands waiting after a report of the state already told", waiting)
	}
}

// TestFailedNotLostBehindInFlightMirroring: the partition recovers (its
// MIRRORING report is being applied) and fails again, reported twice while
// this member's copy of the state still shows the earlier FAILED. The
// second FAILED report found its copy and its last report agreeing and
// dropped the waiting FAILED; the MIRRORING then landed and the state
// showed MIRRORING for a failed partition (issue 19).
func TestFailedNotLostBehindInFlightMirroring(t *testing.T) {
	o, store, key := ownedPartition(t)
	c := &control{o: o}
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}
	gen := partitionOf(store, key).Generation
	const reason = "produce to destination: kafka error 29"
	c.Report(k, gen, fetch.Failed, reason, 0)
	o.out.flush()
	c.Report(k, gen, fetch.Mirroring, "", 0)
	o.out.mu.Lock()
	inFlight := o.out.cmds["state "+k.String()].cmd
	o.out.mu.Unlock()
	c.Report(k, gen, fetch.Failed, reason, 0)
	c.Report(k, gen, fetch.Failed, reason, 0)
	if err := store.Apply(context.Background(), inFlight); err != nil {
		t.Fatal(err)
	}
	o.out.flush()
	if got := partitionOf(store, key); got.State != raftstore.StateFailed || got.Reason != reason {
		t.Fatalf("the replicated state shows %s %q; want FAILED: the last report", got.State, got.Reason)
	}
}

// TestReportOfAnOlderGeneration: a change observed under a generation the
// partition has left (it was assigned again meanwhile) is not reported
// under the new one.
func TestReportOfAnOlderGeneration(t *testing.T) {
	o, store, key := ownedPartition(t)
	c := &control{o: o}
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}
	gen := partitionOf(store, key).Generation
	c.Report(k, gen-1, fetch.Failed, "observed before the reassignment", 0)
	o.out.mu.Lock()
	waiting := len(o.out.cmds)
	o.out.mu.Unlock()
	if waiting != 0 {
		t.Fatalf("a report of generation %d was put while the partition is in %d", gen-1, gen)
	}
}

// ownedPartition opens a one-member raft store holding one MIRRORING
// partition (m/t/0) leased to n1, and n1's owner duties on it (not run:
// the test drives them).
func ownedPartition(t *testing.T) (*Owner, *raftstore.Store, raftstore.PartitionKey) {
	t.Helper()
	store := openLeaderStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := raftstore.PartitionKey{Mirror: "m", Topic: "t", Partition: 0}
	for _, cmd := range []raftstore.Command{
		raftstore.UpsertMember{Member: raftstore.Member{ID: "n1", Voter: true, Joined: true}},
		raftstore.CreateMirror{Mirror: raftstore.Mirror{Name: "m", Bootstrap: []string{"src:9092"}}},
		raftstore.AddTopic{Topic: raftstore.MirrorTopic{Mirror: "m", Topic: "t", State: raftstore.StateMirroring,
			Partitions: []raftstore.PartitionInfo{{State: raftstore.StateMirroring, Producer: raftstore.ProducerIdentity{ProducerID: 1000, Allocated: true}}}}},
		raftstore.AssignPartitions{Assignments: []raftstore.Assignment{{Key: key, Owner: "n1"}}},
	} {
		if err := store.Apply(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	}
	octx, ocancel := context.WithCancel(context.Background())
	t.Cleanup(ocancel)
	return New(octx, Config{NodeID: "n1"}, store, nil, leaderMember{store}, zaptest.NewLogger(t)), store, key
}

// leaderMember is the member of a one-member group: it leads, so it
// applies what it submits itself.
type leaderMember struct{ store *raftstore.Store }

func (l leaderMember) Submit(ctx context.Context, cmd raftstore.Command) error {
	return l.store.Apply(ctx, cmd)
}
func (leaderMember) CaughtUp(context.Context) error { return nil }
func (l leaderMember) RenewLease(ctx context.Context) (api.LeaseGrant, error) {
	if err := l.store.VerifyLeader(ctx); err != nil {
		return api.LeaseGrant{}, err
	}
	var idx uint64
	l.store.Read(func(s *raftstore.State) { idx = s.Index })
	return api.LeaseGrant{Leader: "n1", StateIndex: idx}, nil
}
func (leaderMember) AdvertisedHTTP() string                               { return "127.0.0.1:1" }
func (leaderMember) Self() config.PeerConfig                              { return config.PeerConfig{ID: "n1"} }
func (leaderMember) Source(raftstore.Mirror) fetch.Source                 { return fetch.Source{} }
func (leaderMember) DestinationClusterID(context.Context) (string, error) { return "", nil }
func (leaderMember) Go(f func())                                          { go f() }
func (leaderMember) SourceUnreachable(string) bool                        { return false }
func (leaderMember) DestinationUnanswered() time.Time                     { return time.Time{} }

// partitionOf reads a partition from the store.
func partitionOf(store *raftstore.Store, k raftstore.PartitionKey) (p raftstore.PartitionInfo) {
	store.Read(func(s *raftstore.State) {
		if pi, ok := s.Partition(k); ok {
			p = *pi
		}
	})
	return p
}

// TestLeaseOutlivesMemberLoops: at shutdown the member's loops stop before
// the data path drains; the lease must keep being renewed until StopLease,
// or the drain's writes stop half a second in and it waits out its whole
// bound without a final checkpoint (issue 18).
func TestLeaseOutlivesMemberLoops(t *testing.T) {
	store := openLeaderStore(t)
	octx, ocancel := context.WithCancel(context.Background())
	defer ocancel()
	o := New(octx, Config{NodeID: "n1", LeaseTTL: 4 * time.Second, LeaseMargin: 2 * time.Second}, store, nil, leaderMember{store}, zaptest.NewLogger(t))
	o.startLease() // the lease alone, as Run starts it
	// Not before the state records this member's lease_ttl, which the
	// leader's takeover waits out (issue 19).
	time.Sleep(time.Second)
	if dl := o.writeDeadline(); !dl.IsZero() {
		t.Fatalf("write deadline %s before this member's lease_ttl is in the state", dl)
	}
	if err := store.Apply(context.Background(), raftstore.UpsertMember{Member: raftstore.Member{ID: "n1", LeaseTTLMs: 4000}}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); o.writeDeadline().IsZero(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the lease was not taken within 5s")
		}
	}
	ocancel() // the member stops its loops: the data path drains now
	time.Sleep(3 * leaseCheckSlack)
	if dl := o.writeDeadline(); !dl.After(time.Now()) {
		t.Fatalf("write deadline %s passed %s after the member's loops stopped: the drain cannot write", dl, 3*leaseCheckSlack)
	}
	o.StopLease()
	time.Sleep(2 * leaseCheckSlack)
	if dl := o.writeDeadline(); dl.After(time.Now()) {
		t.Fatalf("write deadline %s still ahead after StopLease", dl)
	}
}

// TestFinishedJobsNotRepeated: a stop or handoff this member completed is
// not started again for the same generation while its own state still
// shows the partition waiting on it, and is forgotten once the state moved
// on (issue 18: stops ran twice).
func TestFinishedJobsNotRepeated(t *testing.T) {
	var o ownerState
	o.init()
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}
	o.finish(k, "stop", 7)
	if !o.isFinished(k, "stop", 7) {
		t.Fatal("a finished stop is not known as finished")
	}
	if o.isFinished(k, "stop", 8) || o.isFinished(k, "handoff", 7) {
		t.Fatal("another generation or kind counted as finished")
	}
	o.forgetFinished(map[fetch.Key]bool{k: true})
	if !o.isFinished(k, "stop", 7) {
		t.Fatal("forgotten while the partition still waits on the job")
	}
	o.forgetFinished(nil)
	if o.isFinished(k, "stop", 7) {
		t.Fatal("kept after the state moved on")
	}
}

// openLeaderStore opens a one-member in-memory raft store and waits until
// it leads.
func openLeaderStore(t *testing.T) *raftstore.Store {
	t.Helper()
	_, tr := raft.NewInmemTransport("")
	store, err := raftstore.Open(raftstore.Config{NodeID: "n1", InMemory: true, Transport: tr, Bootstrap: true,
		HeartbeatTimeout: 100 * time.Millisecond, ElectionTimeout: 100 * time.Millisecond,
		LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return store
}

// TestHandoffReleaseOnItsOwnBound: a handoff's release (which takes no
// context: it runs on a bound of its own, since the release once went out
// with a timed-out drain's expired context, never applied, and the handoff
// started over; issue 18) gives the next owner the drain's exact position
// and finishes the job.
func TestHandoffReleaseOnItsOwnBound(t *testing.T) {
	o, store, key := ownedPartition(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.Apply(ctx, raftstore.UpsertMember{Member: raftstore.Member{ID: "n2", Voter: true, Joined: true}}); err != nil {
		t.Fatal(err)
	}
	gen := partitionOf(store, key).Generation
	if err := store.Apply(ctx, raftstore.RequestMove{Key: key, Generation: gen, To: "n2"}); err != nil {
		t.Fatal(err)
	}
	k := fetch.Key{Mirror: key.Mirror, Topic: key.Topic, Partition: key.Partition}
	j := ownerJob{kind: "handoff", spec: fetch.Spec{Key: k, Generation: gen}, lease: raftstore.Lease{Owner: "n1", Generation: gen}, moveTo: "n2"}
	o.release(j, &fetch.Handoff{Position: fetch.Position{SourceOffset: 40, DestinationOffset: 42}, Sequence: 40,
		Producer: kafka.ProducerID{ID: 1000, Epoch: 3}})
	p := partitionOf(store, key)
	if p.Owner != "n2" || p.Handoff == nil || p.Handoff.SourceOffset != 40 || p.Handoff.DestinationOffset != 42 {
		t.Fatalf("after the release: owner %q, handoff %+v; want n2 with the drain's position 40 -> 42", p.Owner, p.Handoff)
	}
	if !o.owner.isFinished(k, "handoff", gen) {
		t.Fatal("the applied release did not finish the handoff job")
	}
}
