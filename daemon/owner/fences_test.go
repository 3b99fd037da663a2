package owner

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// refusingMember is a group's only member whose lease renewals fail while
// refuse is set (the leader out of reach).
type refusingMember struct {
	leaderMember
	refuse atomic.Bool
}

func (r *refusingMember) RenewLease(ctx context.Context) (api.LeaseGrant, error) {
	if r.refuse.Load() {
		return api.LeaseGrant{}, errors.New("leader out of reach")
	}
	return r.leaderMember.RenewLease(ctx)
}

// TestSpecsCarryTheLeaseLosses: each lease loss counts, and the specs the
// owner gives the engine carry the count they were read under, so the
// engine resumes with the walk a partition whose generation changed
// across a fence instead of trusting its in-memory position (issue 19;
// fetch's TestNewGenerationWalksFromTheDestination: a reconcile that read
// the state before the fence can assign a partition after the fence's
// drop).
func TestSpecsCarryTheLeaseLosses(t *testing.T) {
	o, store, key := ownedPartition(t)
	m := &refusingMember{leaderMember: leaderMember{store}}
	o.member = m
	o.cfg.LeaseTTL, o.cfg.LeaseMargin = 3*time.Second, time.Second
	if err := store.Apply(context.Background(), raftstore.UpsertMember{Member: raftstore.Member{ID: "n1", Voter: true, Joined: true, LeaseTTLMs: 3000}}); err != nil {
		t.Fatal(err)
	}
	o.startLease()
	t.Cleanup(o.StopLease)
	waitSynced := func(want uint64) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			synced, losses := o.leaseSynced()
			if synced && losses == want {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("lease not synced with %d losses within 10s (synced %v, losses %d)", want, synced, losses)
			}
		}
	}
	waitSynced(0)
	m.refuse.Store(true)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if synced, _ := o.leaseSynced(); !synced {
			break
		}
		if time.Now().After(end) {
			t.Fatal("the lease was not lost within 10s of the renewals failing")
		}
	}
	m.refuse.Store(false)
	waitSynced(1)
	_, fences := o.leaseSynced()
	w := o.readOwned(map[fetch.Key]bool{}, fences)
	k := fetch.Key{Mirror: key.Mirror, Topic: key.Topic, Partition: key.Partition}
	if len(w.specs) != 1 || w.specs[0].Key != k || w.specs[0].Fences != 1 {
		t.Fatalf("specs after one lease loss: %+v; want %s with Fences 1", w.specs, k)
	}
}

// TestLeaseWindowAllowsForClockRate: a member whose clock runs slow by
// maxClockRateError writes for its window plus that error, and its last
// request may land produce_timeout + 1 s later; a leader whose clock runs
// fast by as much takes over after lease_ttl less that error. The first
// must end before the second, for the tightest settings the product
// accepts (lease_margin = produce_timeout + 1 s) up to the longest
// lease_ttl.
func TestLeaseWindowAllowsForClockRate(t *testing.T) {
	for _, ttl := range []time.Duration{3250 * time.Millisecond, config.DefaultLeaseTTL, config.MaxLeaseTTL} {
		produceTimeout := 250 * time.Millisecond
		margin := produceTimeout + time.Second
		if err := config.CheckLease(ttl, margin, produceTimeout); err != nil {
			t.Fatal(err)
		}
		o := &Owner{cfg: Config{LeaseTTL: ttl, LeaseMargin: margin}}
		writesEnd := time.Duration(float64(o.leaseWindow())/(1-maxClockRateError)) + produceTimeout + time.Second
		takeover := time.Duration(float64(ttl) / (1 + maxClockRateError))
		if writesEnd > takeover {
			t.Errorf("lease_ttl %s: the slow member's last request may land %s after its contact, the fast leader takes over at %s",
				ttl, writesEnd, takeover)
		}
	}
}

// TestLeaseLossDropsPartitionsBusyWithAJob: on losing its lease the owner
// drops every partition its engine holds, also one busy with a job (a
// handoff's drain, a stop): its queue was fetched under the lost lease and
// must not be sent once the lease is back, as the partition may have moved
// meanwhile (issue 19: the dropAll skipped it, and the job's drain went on
// under the next lease). The job then finds it dropped (fetch's
// TestDropEndsAWaitingDrain).
func TestLeaseLossDropsPartitionsBusyWithAJob(t *testing.T) {
	o, _, key := ownedPartition(t)
	e, dst := ownerEngine(t, o)
	k := fetch.Key{Mirror: key.Mirror, Topic: key.Topic, Partition: key.Partition}
	e.SetSource(k.Mirror, fetch.Source{Bootstrap: dst})
	e.Assign([]fetch.Spec{{Key: k, Generation: 1}})
	if len(e.Held()) != 1 {
		t.Fatal("the engine does not hold the assigned partition")
	}
	if !o.owner.start(k, "handoff") {
		t.Fatal("the partition is busy already")
	}
	defer o.owner.done(k)
	o.dropAll()
	for end := time.Now().Add(5 * time.Second); len(e.Held()) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a partition busy with a job is still held 5s after the lease was lost")
		}
	}
}

// ownerEngine gives o a started data path whose destination is a kfake
// cluster (its addresses returned): enough to hold partitions.
func ownerEngine(t *testing.T, o *Owner) (*fetch.Engine, []string) {
	t.Helper()
	dst, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	e := fetch.New(fetch.Config{Destination: dst.ListenAddrs(), RetryBackoff: 50 * time.Millisecond}, o.Control(), zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	o.SetEngine(e)
	return e, dst.ListenAddrs()
}

// sourceHook is a group's only member that runs hook whenever the owner
// asks it how to reach a mirror's source (while the owner reads the
// state).
type sourceHook struct {
	leaderMember
	hook func()
}

func (s sourceHook) Source(raftstore.Mirror) fetch.Source {
	s.hook()
	return fetch.Source{}
}

// TestReconcileReadingAcrossALossActsOnNothing: a lease lost while the
// owner reads the state makes the reconcile act on nothing: its specs
// carry the loss count from before the loss, and a generation a takeover
// changed after the fence would be taken in place (Spec.Fences). The next
// reconcile, with the lease back, assigns under the new count.
func TestReconcileReadingAcrossALossActsOnNothing(t *testing.T) {
	o, store, _ := ownedPartition(t)
	e, _ := ownerEngine(t, o)
	bumped := false
	o.member = sourceHook{leaderMember{store}, func() {
		if !bumped { // the lease lost and granted again during the read
			bumped = true
			o.lease.mu.Lock()
			o.lease.losses++
			o.lease.mu.Unlock()
		}
	}}
	o.lease.mu.Lock()
	o.lease.synced = true
	o.lease.mu.Unlock()
	if settled, _ := o.ownerReconcile(); settled || len(e.Held()) != 0 {
		t.Fatalf("a reconcile that read the state across a lease loss acted: settled %v, %d partitions assigned", settled, len(e.Held()))
	}
	o.ownerReconcile()
	if len(e.Held()) != 1 {
		t.Fatalf("the next reconcile assigned %d partitions, want 1", len(e.Held()))
	}
}
