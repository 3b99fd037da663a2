package fetch

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestUnansweredProduceIsReported: while the destination takes produce
// requests and never answers them (a stalled link: the request is
// written, no answer comes), the partition reports since when its produce
// has gone unanswered, through the timeouts, confirm walks and resends
// that follow; once the destination answers again the mark clears and the
// records are mirrored once each (issue 18: an owner whose destination
// link stalled kept its partitions, since nothing said so).
func TestUnansweredProduceIsReported(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 300 * time.Millisecond })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 100)
	if since, _ := x.e.OldestUnansweredProduce(); !since.IsZero() {
		t.Fatalf("a destination that answers every produce reported unanswered since %v", since)
	}

	var stalled atomic.Bool
	wake := make(chan struct{})
	stalled.Store(true)
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		if stalled.Load() {
			x.dst.SleepControl(func() { <-wake })
		}
		return nil, nil, false
	})
	before := time.Now()
	x.produce(x.src, "t", 100, 100)
	deadline := time.Now().Add(20 * time.Second)
	for {
		since, key := x.e.OldestUnansweredProduce()
		if !since.IsZero() && time.Since(since) > 2*time.Second {
			own := x.e.Statuses()[0].DestinationUnanswered
			if key != k || since.Before(before) || !own.Equal(since) {
				t.Fatalf("unanswered since %v for %s (partition's own: %v), want %s, not before the stall began at %v",
					since, key, own, k, before)
			}
			break // kept through at least a few produce timeouts
		}
		if time.Now().After(deadline) {
			t.Fatalf("no unanswered produce reported after 20 s of a stalled destination: %v", since)
		}
		time.Sleep(50 * time.Millisecond)
	}

	stalled.Store(false)
	close(wake)
	x.waitCaughtUp("t", 1)
	if since, _ := x.e.OldestUnansweredProduce(); !since.IsZero() {
		t.Fatalf("still unanswered since %v after the destination answered again", since)
	}
	x.requireMirrored("t", 1)
}

// TestSettleUnverified: records past a partition's checkpoint that a stop
// could not verify are verified once the source answers: the walk counts
// kmirror's copies up to the destination's end at the stop, stops at the
// applications' records written after it, and a record before that end
// that is not the source's is named as a divergence at the position the
// copies reach.
func TestSettleUnverified(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.Checkpoint = time.Hour })
	x.createTopic("t", 1)
	spec := specs("t", 1)[0]
	x.produce(x.src, "t", 0, 100)
	x.e.Assign([]Spec{spec})
	x.waitCaughtUp("t", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A crash: nothing past the first checkpoint was recorded.
	if err := x.e.Drop(ctx, spec.Key); err != nil {
		t.Fatal(err)
	}
	if pos, ok, err := x.e.Checkpointed(ctx, spec.Key); err != nil || (ok && pos.DestinationOffset >= 100) {
		t.Fatalf("checkpoint %+v (%t, %v): the test needs one behind the destination's end", pos, ok, err)
	}
	spec = x.leased([]Spec{spec})[0]
	pos, err := x.e.SettleUnverified(ctx, spec, 100)
	if err != nil || pos.SourceOffset != 100 || pos.DestinationOffset != 100 {
		t.Fatalf("settled at %+v, %v; want source and destination offset 100", pos, err)
	}
	if cp, ok, err := x.e.Checkpointed(ctx, spec.Key); err != nil || !ok || cp.DestinationOffset != 100 {
		t.Fatalf("checkpoint after settling: %+v, %t, %v; want destination offset 100", cp, ok, err)
	}
	// The topic is writable after the stop: an application writes.
	x.produce(x.dst, "t", 1000, 10)
	if pos, err := x.e.SettleUnverified(ctx, spec, 100); err != nil || pos.DestinationOffset != 100 {
		t.Fatalf("with the applications' records after the stop's end: %+v, %v; want 100, no error", pos, err)
	}
	// Records inside the range the stop could not verify that the
	// source does not hold (yet: a returning source leader's last stable
	// offset may lag): try again, nothing decided.
	var dv *Divergence
	if pos, err := x.e.SettleUnverified(ctx, spec, 105); err == nil || errors.As(err, &dv) {
		t.Fatalf("records past the source's end inside the range: %+v, %v; want an error to try again", pos, err)
	}
	// ...and ones that differ from the source's: a divergence, at the
	// position kmirror's copies reach.
	x.produce(x.src, "t", 100, 5)
	pos, err = x.e.SettleUnverified(ctx, spec, 105)
	if !errors.As(err, &dv) || pos.DestinationOffset != 100 || !strings.Contains(dv.Reason, "does not match source offset") {
		t.Fatalf("an application's record inside the unverified range: %+v, %v; want position 100 and a divergence", pos, err)
	}
}

// TestFencedMemberSendsNoProduce: once this member's lease has ended the
// sender collects nothing (fetch/DESIGN.md, self-fencing): no produce
// request reaches the destination, and the partition says why, naming the
// lease; the socket's write deadline is only the second gate. Once the
// lease is back the records are mirrored once each.
func TestFencedMemberSendsNoProduce(t *testing.T) {
	x := newKfakePair(t)
	x.mirrorCaughtUp("t", 1, 50)

	var produces atomic.Int32
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		produces.Add(1)
		return nil, nil, false
	})
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond)
	x.ctl.mu.Unlock()
	x.produce(x.src, "t", 50, 50)
	waitUntil(t, 10*time.Second, "the partition naming the lease", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && strings.Contains(st[0].Retrying, "lease: this member has not heard from the raft leader in time")
	})
	if n := produces.Load(); n != 0 {
		st := x.e.Statuses()
		t.Fatalf("%d produce requests reached the destination after the lease ended (status %+v)", n, st)
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{}
	x.ctl.mu.Unlock()
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}

// TestReleaseTimeoutStopsSending: a Release whose drain does not finish
// within its context (the destination holds the partition's produce)
// leaves the partition dropped: its queued batches are never sent, not
// even once the held produce is answered, and it leaves the engine then
// (issue 19: it stayed DRAINING and sent its queue after the caller had
// given up, which for a handoff meant after the next owner could write).
func TestReleaseTimeoutStopsSending(t *testing.T) {
	// Its record sets are small: keep them aliased, not copied, so the
	// in-flight hold is what keeps them (recordBuf).
	copySparseRecordSets = false
	t.Cleanup(func() { copySparseRecordSets = true })
	var mu sync.Mutex
	var sends []time.Time
	var events []ProduceEvent
	x := newKfakePair(t, func(c *Config) {
		c.ProduceTimeout = 20 * time.Second
		c.ProduceObserver = func(ev ProduceEvent) {
			if ev.Key.Topic == "t" {
				mu.Lock()
				sends = append(sends, ev.SentAt)
				events = append(events, ev)
				mu.Unlock()
			}
		}
	})
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)

	held, _, wake := x.holdProduce()
	// Five source batches: the first held in flight, the others in flight
	// behind it (the produce window) or queued.
	for i := range 5 {
		x.produce(x.src, "t", 10+10*i, 10)
	}
	waitUntil(t, 10*time.Second, "a produce held by the destination", func() bool { return held.Load() > 0 })
	waitUntil(t, 10*time.Second, "the source's end seen", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == 60
	})
	time.Sleep(500 * time.Millisecond) // the rest of the batches fetched and queued

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := x.e.Release(ctx, k)
	cancel()
	gaveUp := time.Now()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release with its produce held: %v, want its context's deadline", err)
	}
	wake()
	time.Sleep(time.Second) // a DRAINING partition would send its queue now
	mu.Lock()
	late := 0
	for _, at := range sends {
		if at.After(gaveUp) {
			late++
		}
	}
	mu.Unlock()
	if late != 0 {
		t.Fatalf("%d produce requests sent after the Release gave up: the timed-out drain kept sending", late)
	}
	waitUntil(t, 10*time.Second, "the dropped partition leaving the engine", func() bool { return len(x.e.Statuses()) == 0 })
	// The held batches were dropped from the queue while in flight: their
	// record sets stay theirs until the answers are read (the observer
	// reads the batches then), not poisoned and reused (recordBuf).
	waitUntil(t, 10*time.Second, "the memory budget back to 0 once the held answers are in", func() bool {
		x.e.mu.Lock()
		defer x.e.mu.Unlock()
		return x.e.inUse == 0
	})
	mu.Lock()
	defer mu.Unlock()
	for _, ev := range events {
		if ev.Records != 10 || ev.ProducerID != events[0].ProducerID || ev.ProducerID < 0 {
			t.Fatalf("a batch in flight read back as %d records of producer %d (the first: %d records of %d): "+
				"its record set was released while a request carried it", ev.Records, ev.ProducerID, events[0].Records, events[0].ProducerID)
		}
	}
}

// TestDropEndsAWaitingDrain: a partition draining for a handoff when this
// member is fenced (its queue cannot be sent) is dropped under the
// handoff (the owner's dropAll, issue 19: a drain that went on once the
// lease was back sent batches fetched under the lost one, though the
// partition may have moved meanwhile). The waiting handoff ends at once,
// unclean: no exact position, so the next owner walks; and nothing of the
// queue is sent once the lease is back.
func TestDropEndsAWaitingDrain(t *testing.T) {
	x := newKfakePair(t)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond) // fenced
	x.ctl.mu.Unlock()
	x.produce(x.src, "t", 10, 10)
	waitUntil(t, 10*time.Second, "the new records fetched and queued", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == 20
	})
	var produced atomic.Int32
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		produced.Add(1)
		return nil, nil, false
	})
	type result struct {
		h   *Handoff
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		h, err := x.e.HandOff(ctx, k)
		done <- result{h, err}
	}()
	time.Sleep(300 * time.Millisecond) // the drain waits on the fenced queue
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := x.e.Drop(ctx, k); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.h != nil {
			t.Fatalf("the handoff of a dropped partition gave an exact position %+v; the next owner must walk", *r.h)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handoff still waited on the drain 5s after the partition was dropped")
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{} // the lease is back
	x.ctl.mu.Unlock()
	time.Sleep(time.Second)
	if n := produced.Load(); n != 0 {
		t.Fatalf("%d produce requests after the drop: the dropped queue was sent", n)
	}
	if len(x.e.Statuses()) != 0 {
		t.Fatal("the dropped partition is still held")
	}
}

// TestPartitionAssignedBeforeALossSendsNothing: a partition the owner
// assigned before its latest lease loss sends nothing once the lease is
// back, until the owner assigns it again under the new lease (with the
// new loss count): it may have moved meanwhile (issue 19: a partition a
// lease loss did not drop went on sending what it fetched under the lost
// lease).
func TestPartitionAssignedBeforeALossSendsNothing(t *testing.T) {
	x := newKfakePair(t)
	x.mirrorCaughtUp("t", 1, 10)
	produced := x.countProduce("t")
	x.ctl.mu.Lock()
	x.ctl.losses++ // lost and granted again: the deadline is ahead
	x.ctl.mu.Unlock()
	x.produce(x.src, "t", 10, 10)
	waitUntil(t, 10*time.Second, "the new records fetched", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == 20
	})
	x.requireHeldUntilReassigned(produced)
}

// TestLossBetweenTheReadsSendsNothing: a lease lost and granted again
// between the sender's read of the loss count and its read of the write
// deadline must not let a partition assigned before the loss send under
// the new lease: the count the guard compares is read after the deadline.
func TestLossBetweenTheReadsSendsNothing(t *testing.T) {
	x := newKfakePair(t)
	x.mirrorCaughtUp("t", 1, 10)
	time.Sleep(300 * time.Millisecond) // the checkpoint written: nothing dirty
	produced := x.countProduce("t")
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond) // fenced: the new records stay queued
	x.ctl.mu.Unlock()
	x.produce(x.src, "t", 10, 10)
	waitUntil(t, 10*time.Second, "the new records fetched", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == 20
	})
	// A new lease, granted after a loss counted just as the sender reads
	// the deadline of the round that would send: the second read (the
	// first round only checks the destination topic, idle over 200 ms:
	// destinationVerifyGap).
	calls := 0
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{}
	x.ctl.onDeadline = func(c *fakeControl) bool {
		if calls++; calls < 2 {
			return false
		}
		c.losses++
		return true
	}
	x.ctl.mu.Unlock()
	x.requireHeldUntilReassigned(produced)
}

// TestStopOfAPartitionAssignedBeforeALoss: a stop (or a handoff, a pause)
// of a partition assigned before the latest lease loss, whose queue may
// not be sent, does not wait out its bound on a drain that cannot happen:
// the partition is dropped and its position settled by the walk at once.
func TestStopOfAPartitionAssignedBeforeALoss(t *testing.T) {
	x := newKfakePair(t)
	x.mirrorCaughtUp("t", 1, 10)
	x.ctl.mu.Lock()
	x.ctl.losses++
	x.ctl.mu.Unlock()
	x.produce(x.src, "t", 10, 10)
	waitUntil(t, 10*time.Second, "the new records fetched", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == 20
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	pos, err := x.e.Stop(ctx, specs("t", 1)[0])
	if err != nil {
		t.Fatalf("stop after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if pos.SourceOffset != 10 || pos.DestinationOffset != 10 {
		t.Fatalf("stop settled at %+v; want source 10, destination 10 (the queue fetched under the lost lease was not sent)", pos)
	}
}

// TestDropTimeoutStillForgets: a Drop whose context ends while the
// partition's produce is still in flight returns that error, and the
// partition leaves the engine all the same once the produce ends; left
// listed and dropped, the next Assign of it would never start it again.
func TestDropTimeoutStillForgets(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 20 * time.Second })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	held, _, wake := x.holdProduce()
	x.produce(x.src, "t", 10, 10)
	waitUntil(t, 10*time.Second, "a produce held by the destination", func() bool { return held.Load() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := x.e.Drop(ctx, k)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Drop with its produce held: %v, want its context's deadline", err)
	}
	wake()
	waitUntil(t, 10*time.Second, "the dropped partition leaving the engine", func() bool { return len(x.e.Statuses()) == 0 })
	x.e.Assign(x.leased(specs("t", 1)))
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}

// TestProduceConnectionUserTimeout: a produce connection gives up
// unacknowledged request bytes after produce_timeout + 1 s
// (TCP_USER_TIMEOUT) instead of the kernel's retransmissions for up to
// ~15 minutes, which could deliver a request long after the lease ended
// (issue 19; the checkpoint connection has the same test).
func TestProduceConnectionUserTimeout(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 2 * time.Second })
	x.mirrorCaughtUp("t", 2, 20)
	x.e.mu.Lock()
	var conns []*kwire.Conn
	for _, w := range x.e.senders {
		if c := w.conn.Load(); c != nil {
			conns = append(conns, c)
		}
	}
	x.e.mu.Unlock()
	if len(conns) == 0 {
		t.Fatal("no produce connection after mirroring records")
	}
	for _, c := range conns {
		if ut, err := c.UserTimeout(); err != nil || ut != 3*time.Second {
			t.Fatalf("produce connection's TCP_USER_TIMEOUT %v (%v), want produce_timeout + 1s = 3s", ut, err)
		}
	}
}

// TestLeaseEndResetsUnansweredProduce: a produce request sent under the
// lease and still unanswered when the lease ends has its connection reset
// at the lease end (RST: what of it is still in the socket's send buffer
// is discarded, not delivered into the broker later), not at
// produce_timeout. A lease renewed before its end is waited out, but not
// one that was lost and granted again since the request went out (a
// lease-end timer that ran late, the process frozen): the request went
// under the lapsed lease. Once the lease is back the partition confirms
// what landed, and the destination equals the source record by record.
func TestLeaseEndResetsUnansweredProduce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lost      bool // the renewal comes after a lease loss
		renew     bool // a renewal before the lease end
		wantReset bool
	}{
		{name: "lease ends", wantReset: true},
		{name: "lease renewed", renew: true},
		{name: "lease lost and granted again", renew: true, lost: true, wantReset: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				mu     sync.Mutex
				events []ProduceEvent
			)
			x := newKfakePair(t, func(c *Config) {
				c.ProduceTimeout = 20 * time.Second
				c.ProduceObserver = func(ev ProduceEvent) {
					mu.Lock()
					events = append(events, ev)
					mu.Unlock()
				}
			})
			x.mirrorCaughtUp("t", 1, 10)
			var (
				held    atomic.Int32
				holding atomic.Bool
			)
			holding.Store(true)
			wake := make(chan struct{})
			x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				x.dst.KeepControl()
				if holding.Load() {
					held.Add(1)
					x.dst.SleepControl(func() { <-wake })
				}
				return nil, nil, false
			})
			leaseEnd := time.Now().Add(1500 * time.Millisecond)
			x.ctl.mu.Lock()
			x.ctl.deadline = leaseEnd
			x.ctl.mu.Unlock()
			x.produce(x.src, "t", 10, 10)
			waitUntil(t, 5*time.Second, "a produce held unanswered by the destination", func() bool { return held.Load() > 0 })
			if tc.renew {
				x.ctl.mu.Lock()
				x.ctl.deadline = time.Now().Add(time.Hour)
				if tc.lost {
					x.ctl.losses++
				}
				x.ctl.mu.Unlock()
			}
			resetAtEnd := func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, ev := range events {
					if !ev.Answered && ev.EndedAt.After(leaseEnd) {
						return true
					}
				}
				return false
			}
			if tc.wantReset {
				waitUntil(t, 5*time.Second, "the unanswered produce ended by a reset at the lease end", resetAtEnd)
			} else {
				time.Sleep(time.Until(leaseEnd) + time.Second)
				if resetAtEnd() {
					t.Fatal("the produce was reset at the end of a lease renewed before it")
				}
			}
			holding.Store(false)
			close(wake)
			x.ctl.mu.Lock()
			x.ctl.deadline = time.Time{}
			x.ctl.mu.Unlock()
			if tc.lost { // the owner assigns it again under the new lease
				sp := specs("t", 1)
				sp[0].Fences = 1
				x.e.Assign(sp)
			}
			x.waitCaughtUp("t", 1)
			x.requireMirrored("t", 1)
		})
	}
}

// holdProduce makes the destination hold every produce request (held
// counts them) until wake; those after it pass (after counts them).
func (x *kfakePair) holdProduce() (held, after *atomic.Int32, wake func()) {
	held, after = new(atomic.Int32), new(atomic.Int32)
	var woken atomic.Bool
	ch := make(chan struct{})
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		if woken.Load() {
			after.Add(1)
			return nil, nil, false
		}
		held.Add(1)
		x.dst.SleepControl(func() { <-ch })
		return nil, nil, false
	})
	return held, after, func() {
		woken.Store(true)
		close(ch)
	}
}

// countProduce counts the produce requests carrying a batch of topic (not
// the checkpoints).
func (x *kfakePair) countProduce(topic string) *atomic.Int32 {
	n := new(atomic.Int32)
	x.dst.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		for _, tp := range r.(*kmsg.ProduceRequest).Topics {
			if tp.Topic == topic {
				n.Add(1)
			}
		}
		return nil, nil, false
	})
	return n
}

// requireHeldUntilReassigned checks that partition t/0, assigned before
// a lease loss (fakeControl.losses 1), sends nothing for a second
// (produced counts its produce requests), then that it mirrors once
// assigned again under the new count.
func (x *kfakePair) requireHeldUntilReassigned(produced *atomic.Int32) {
	x.t.Helper()
	time.Sleep(time.Second)
	if n := produced.Load(); n != 0 {
		x.t.Fatalf("%d produce requests for a partition assigned before the lease loss", n)
	}
	sp := specs("t", 1)
	sp[0].Fences = 1
	x.e.Assign(sp)
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}

// TestWalkRefusesEqualForeignRecord: an application writes a record to the
// destination partition while kmirror is down, and the same record (key,
// value, headers, timestamp) reaches the source, as a mirror in the other
// direction would copy it there (an echo loop, issue 21). The resume walk
// finds them equal, but the destination's was not written under kmirror's
// producer identity: the partition is DIVERGED, naming a possible loop,
// and kmirror writes nothing after it.
func TestWalkRefusesEqualForeignRecord(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.Checkpoint = time.Hour })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.e.Drop(ctx, k); err != nil {
		t.Fatal(err)
	}
	echo := func() *kgo.Record {
		return &kgo.Record{Topic: "t", Key: []byte("k-echo"), Value: []byte("written once by an application"),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte("1")}}, Timestamp: time.UnixMilli(1_700_000_000_000)}
	}
	for _, cl := range []*kfake.Cluster{x.dst, x.src} {
		if err := x.client(cl).ProduceSync(ctx, echo()).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	x.e.Assign(x.leased(specs("t", 1)))
	waitUntil(t, 20*time.Second, "the partition DIVERGED", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].State == Diverged
	})
	if why := x.e.Statuses()[0].Reason; !strings.Contains(why, "equals source offset 10 but kmirror did not write it") ||
		!strings.Contains(why, "mirror loop") {
		t.Fatalf("DIVERGED reason %q does not say the equal record is not kmirror's", why)
	}
	if end := x.dst.PartitionInfo("t", 0).HighWatermark; end != 11 {
		t.Fatalf("destination end %d, want 11: kmirror wrote after the foreign record", end)
	}
}
