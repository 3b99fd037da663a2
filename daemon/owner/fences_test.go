package owner

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

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
// fetch's TestNewGenerationWalksFromTheDestination: the dropAll at the
// fence skips a partition busy with a job).
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
