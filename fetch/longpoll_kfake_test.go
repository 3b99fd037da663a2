package fetch

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestIdleSessionLongPolls: while nothing arrives, a fetch loop asks the
// source broker to wait longer and longer (doubling up to
// IdleFetchMaxWait), so an idle session costs the broker few reads of its
// partitions (issue 20: 10,000 idle partitions fetched every 500 ms took
// 10-18% of a source broker's core). Records arriving end the wait at
// once, and so do partitions routed to the loop during a long wait: each
// is mirrored well before the wait in flight would have run out.
func TestIdleSessionLongPolls(t *testing.T) {
	x := newKfakePair(t, func(c *Config) {
		c.FetchMaxWait = 100 * time.Millisecond
		c.IdleFetchMaxWait = 30 * time.Second
	})
	x.mirrorCaughtUp("a", 4, 20)

	var (
		fetches atomic.Int32
		longAt  atomic.Int64 // when a fetch waiting 6.4 s or more went out
	)
	x.src.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.src.KeepControl()
		fetches.Add(1)
		if r.(*kmsg.FetchRequest).MaxWaitMillis >= 6400 {
			longAt.CompareAndSwap(0, time.Now().UnixNano())
		}
		return nil, nil, false
	})
	time.Sleep(4 * time.Second) // the waits grow: 0.1, 0.1, 0.2, 0.4 ... 3.2, 6.4 s
	before := fetches.Load()
	time.Sleep(6 * time.Second)
	if n := fetches.Load() - before; n > 3 {
		t.Fatalf("%d fetches in 6 s of an idle session: the wait did not grow (at 100 ms: 60)", n)
	}

	x.produce(x.src, "a", 20, 20)
	waitUntil(t, 5*time.Second, "records mirrored while a fetch waits 6.4-30 s", func() bool {
		return x.caughtUp("a", 4)
	})
	longAt.Store(0)
	waitUntil(t, 20*time.Second, "an idle fetch waiting 6.4 s or more", func() bool { return longAt.Load() != 0 })
	x.createTopic("b", 1)
	x.produce(x.src, "b", 0, 10)
	x.e.Assign(specs("b", 1))
	waitUntil(t, 4*time.Second, "a partition routed during a wait of 6.4 s or more mirrored", func() bool {
		return x.caughtUp("b", 1)
	})
	x.requireMirrored("a", 4)
	x.requireMirrored("b", 1)
}

// TestRoutingEndsOnlyItsLoopsLongPoll: with two fetch connections to the
// source broker, both idle in long polls, a partition routed to the broker
// ends the long poll of the one loop that fetches it, not the other's: a
// partition whose leader flaps would otherwise reopen every idle session
// of the broker (each interrupted poll closes its connection and starts a
// new session with a full fetch).
func TestRoutingEndsOnlyItsLoopsLongPoll(t *testing.T) {
	x := newKfakePair(t, func(c *Config) {
		c.FetchMaxWait = 100 * time.Millisecond
		c.IdleFetchMaxWait = 30 * time.Second
	})
	x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), FetchConnections: 2})
	x.mirrorCaughtUp("a", 8, 20)
	slots := map[int]bool{}
	for i := range int32(8) {
		slots[fetchSlot(Key{Mirror: "m", Topic: "a", Partition: i}, 2)] = true
	}
	if len(slots) != 2 {
		t.Fatalf("topic a's partitions use fetch slots %v; the test needs both", slots)
	}

	var (
		full atomic.Int32 // fetches that open a new session
		mu   sync.Mutex
		long = map[int32]bool{} // sessions that sent a fetch waiting 6.4 s or more
	)
	x.src.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.src.KeepControl()
		req := r.(*kmsg.FetchRequest)
		if req.SessionEpoch <= 0 {
			full.Add(1)
		}
		if req.MaxWaitMillis >= 6400 {
			mu.Lock()
			long[req.SessionID] = true
			mu.Unlock()
		}
		return nil, nil, false
	})
	waitUntil(t, 20*time.Second, "both loops in long polls of 6.4 s or more", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(long) >= 2
	})
	time.Sleep(200 * time.Millisecond)
	x.createTopic("b", 1)
	x.produce(x.src, "b", 0, 10)
	before := full.Load()
	x.e.Assign(specs("b", 1))
	waitUntil(t, 4*time.Second, "a partition routed during the long polls mirrored", func() bool {
		return x.caughtUp("b", 1)
	})
	time.Sleep(time.Second)
	if n := full.Load() - before; n != 1 {
		t.Fatalf("%d fetch sessions opened anew after one partition was routed; want 1 (its own loop's)", n)
	}
	x.requireMirrored("a", 8)
	x.requireMirrored("b", 1)
}

// TestHeldPartitionIsFetchedBeforeTheLongPollEnds: a partition whose
// queue is full is left out of its loop's fetches; when the loop's other
// partitions are idle, the fetch for them waits at the broker, and the
// held partition, drained meanwhile, could not be asked for until that
// wait ran out. Such waits halved the copy rate across a 50 ms round
// trip (issue 20). A loop holding a partition asks for short waits
// (heldFetchMaxWait, doubling while answers stay empty), so a partition
// that fills its queue dozens of times is mirrored long before even one
// FetchMaxWait (3 s here) would have run out.
func TestHeldPartitionIsFetchedBeforeTheLongPollEnds(t *testing.T) {
	const maxWait = 3 * time.Second
	x := newKfakePair(t, func(c *Config) {
		c.FetchMaxWait = maxWait
		c.PartitionBytes = 512 // the queue limit is two of these
	})
	var asked, left atomic.Int32 // fetches that asked for "busy", that left it out
	x.src.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.src.KeepControl()
		req := r.(*kmsg.FetchRequest)
		for _, tp := range req.Topics {
			if tp.Topic == "busy" {
				asked.Add(1)
			}
		}
		for _, tp := range req.ForgottenTopics {
			if tp.Topic == "busy" {
				left.Add(1)
			}
		}
		return nil, nil, false
	})
	x.mirrorCaughtUp("idle", 1, 0)
	x.mirrorCaughtUp("busy", 1, 0)
	// The loop may have gone into a wait for "idle" alone before "busy"
	// was routed to it: from the fetch that asks for both on, records
	// end each wait at once.
	waitUntil(t, 2*maxWait, "a fetch for the busy partition", func() bool { return asked.Load() > 0 })
	// Slow answers keep the queue full: fetches outrun produces.
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		x.dst.SleepControl(func() { time.Sleep(20 * time.Millisecond) })
		return nil, nil, false
	})
	start := time.Now()
	for i := 0; i < 40; i++ {
		x.produce(x.src, "busy", i*10, 10) // 40 batches of about 300 bytes
	}
	waitUntil(t, maxWait, "40 batches mirrored through a queue limit of about 3 of them", func() bool {
		return x.caughtUp("busy", 1)
	})
	if left.Load() == 0 {
		t.Fatal("no fetch left the busy partition out: its queue never filled, so this test proves nothing")
	}
	t.Logf("mirrored in %v; %d fetches left the busy partition out", time.Since(start).Round(time.Millisecond), left.Load())
	x.requireMirrored("busy", 1)
	x.requireMirrored("idle", 1)
}
