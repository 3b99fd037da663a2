package fetch

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// inflightOf is partition k's count of batches in flight.
func (x *kfakePair) inflightOf(k Key) int {
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	for _, p := range x.e.parts {
		if p.key() == k {
			return p.inflight
		}
	}
	return -1
}

// sourceBatches writes n single-record batches to topic's partition 0 on
// the source, from record from, and waits until the engine has seen them.
func (x *kfakePair) sourceBatches(topic string, from, n int) {
	x.t.Helper()
	for i := range n {
		x.produce(x.src, topic, from+i, 1)
	}
	waitUntil(x.t, 10*time.Second, "the source's new end seen", func() bool {
		st := x.e.Statuses()
		return len(st) == 1 && st[0].SourceEnd == int64(from+n)
	})
}

// TestProduceWindowKeepsBatchesInFlight: while the destination holds a
// partition's first produce, the engine sends the partition's next
// batches behind it, up to Config.ProduceWindow in flight (one with a
// window of 1); once the destination answers, every record is mirrored
// once, in order.
func TestProduceWindowKeepsBatchesInFlight(t *testing.T) {
	for _, tc := range []struct {
		name       string
		window     int
		checkSlack time.Duration
	}{
		{"window 5", MaxProduceWindow, 0},
		{"window 1", 1, 0},
		// The owner caps every write deadline at its lease loop's last
		// check plus 500 ms; the window's rule moves the lease's end, not
		// that cap (with the cap moved too, the window never opened in
		// the daemon: bench --destination-rtt, issue 20).
		{"window 5 under a lease check", MaxProduceWindow, 500 * time.Millisecond},
	} {
		window := tc.window
		t.Run(tc.name, func(t *testing.T) {
			x := newKfakePair(t, func(c *Config) { c.ProduceWindow = window; c.ProduceTimeout = 20 * time.Second })
			x.ctl.mu.Lock()
			x.ctl.checkSlack = tc.checkSlack
			x.ctl.mu.Unlock()
			k := Key{Mirror: "m", Topic: "t", Partition: 0}
			x.mirrorCaughtUp("t", 1, 10)
			held, _, wake := x.holdProduce()
			x.sourceBatches("t", 10, 8)
			waitUntil(t, 10*time.Second, "a produce held by the destination", func() bool { return held.Load() > 0 })
			waitUntil(t, 10*time.Second, "the window full", func() bool { return x.inflightOf(k) >= window })
			time.Sleep(300 * time.Millisecond) // no more than the window goes out
			if n := x.inflightOf(k); n != window {
				t.Fatalf("%d batches in flight behind a held produce, want the window's %d", n, window)
			}
			wake()
			x.waitCaughtUp("t", 1)
			x.requireMirrored("t", 1)
		})
	}
}

// onFirstProduce hands the destination's first produce request for topic
// to handle (kfake's control: its answer, or nil and false to let the
// broker handle it, after whatever handle waited for); the others are
// handled as usual.
func (x *kfakePair) onFirstProduce(topic string, handle func(*kmsg.ProduceRequest) (kmsg.Response, error, bool)) {
	var done atomic.Bool
	x.dst.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		req := r.(*kmsg.ProduceRequest)
		if done.Load() || len(req.Topics) == 0 || req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		done.Store(true)
		return handle(req)
	})
}

// waitInflight sleeps, in kfake's control, until at least n batches of k
// are in flight (10 s at most).
func (x *kfakePair) waitInflight(k Key, n int) {
	x.dst.SleepControl(func() {
		deadline := time.Now().Add(10 * time.Second)
		for x.inflightOf(k) < n && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	})
}

// failFirstProduce makes the destination answer the first produce of
// topic, once at least inflight batches of k are in flight, with code for
// every partition in it, before appending anything; later ones are
// handled as usual.
func (x *kfakePair) failFirstProduce(topic string, k Key, inflight int, code int16) {
	x.onFirstProduce(topic, func(req *kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		x.waitInflight(k, inflight)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// TestWindowFailureVoidsTheBatchesBehind: the destination fails the
// first batch of a full window without appending it, with an error that
// says it was not appended (NOT_ENOUGH_REPLICAS) or one that leaves it
// open (REQUEST_TIMED_OUT: a broker may time out after the append). The
// batches behind it then meet OUT_OF_ORDER_SEQUENCE_NUMBER, which here
// says nothing about the producer's identity: the engine must not ask for
// a new producer epoch for them, and must not confirm what landed before
// the window's answers are all in (a walk would miss a batch still in
// flight); it then resends what is missing. Every record lands once, in
// order.
func TestWindowFailureVoidsTheBatchesBehind(t *testing.T) {
	for name, code := range map[string]int16{"NOT_ENOUGH_REPLICAS": kerr.NotEnoughReplicas.Code, "REQUEST_TIMED_OUT": kerr.RequestTimedOut.Code} {
		t.Run(name, func(t *testing.T) {
			x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 20 * time.Second })
			k := Key{Mirror: "m", Topic: "t", Partition: 0}
			x.mirrorCaughtUp("t", 1, 10)
			x.failFirstProduce("t", k, 3, code)
			x.sourceBatches("t", 10, 8)
			x.waitCaughtUp("t", 1)
			x.requireMirrored("t", 1)
			x.ctl.mu.Lock()
			renewals := len(x.ctl.renewals)
			x.ctl.mu.Unlock()
			if renewals != 0 {
				t.Fatalf("%d producer renewals asked for: the batches behind a failed one were taken for an identity fault", renewals)
			}
		})
	}
}

// TestWindowUnansweredFirstBatchConfirms: the destination holds the first
// batch of a full window past produce_timeout + AnswerSlack and appends it
// afterwards: its outcome is unknown, the connection is reset and the
// batches behind it are void; the engine confirms what landed and
// resends the rest, and every record lands once, in order.
func TestWindowUnansweredFirstBatchConfirms(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 300 * time.Millisecond })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	var ended atomic.Bool
	x.onFirstProduce("t", func(*kmsg.ProduceRequest) (kmsg.Response, error, bool) {
		x.waitInflight(k, 3)
		x.dst.SleepControl(func() {
			time.Sleep(2 * time.Second) // past 300 ms + AnswerSlack
			ended.Store(true)
		})
		return nil, nil, false // then appended, or found a duplicate
	})
	x.sourceBatches("t", 10, 8)
	x.waitCaughtUp("t", 1)
	waitUntil(t, 10*time.Second, "the held produce handled", ended.Load)
	time.Sleep(200 * time.Millisecond)
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}

// TestWindowShrinksNearTheLeaseEnd: a request with n requests ahead of it
// on its connection is written only up to n produce timeouts before the
// lease's end (the broker handles them one at a time), so every request is
// answered within produce_timeout of the lease's end. With 10 s of lease
// left and a 4 s produce timeout, a held partition has 3 batches in
// flight, not 5; once the lease is renewed far ahead, the rest go out.
func TestWindowShrinksNearTheLeaseEnd(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 4 * time.Second })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	held, _, wake := x.holdProduce()
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(10 * time.Second)
	x.ctl.mu.Unlock()
	x.sourceBatches("t", 10, 8)
	waitUntil(t, 10*time.Second, "a produce held by the destination", func() bool { return held.Load() > 0 })
	waitUntil(t, 3*time.Second, "three batches in flight", func() bool { return x.inflightOf(k) >= 3 })
	time.Sleep(300 * time.Millisecond)
	if n := x.inflightOf(k); n != 3 {
		t.Fatalf("%d batches in flight with 10 s of lease left and a 4 s produce timeout, want 3", n)
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{} // renewed: a lease that never ends
	x.ctl.mu.Unlock()
	waitUntil(t, 3*time.Second, "the full window in flight", func() bool { return x.inflightOf(k) == MaxProduceWindow })
	wake()
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}

// TestWindowSendsOldRecordsOneAtATime: a broker forgets an idempotent
// producer whose last batch's records are older than
// producer.id.expiration.ms, and then appends a batch at any sequence, so
// a batch sent behind one it refuses could land in that one's place. The
// window therefore widens only behind batches of recent records (and once
// the broker acknowledged one in this run): batches of records an hour
// old go one at a time, even behind a held produce.
func TestWindowSendsOldRecordsOneAtATime(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 20 * time.Second })
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.mirrorCaughtUp("t", 1, 10)
	held, _, wake := x.holdProduce()
	prod := x.client(x.src, kgo.DefaultProduceTopic("t"))
	old := time.Now().Add(-time.Hour)
	for i := range 8 {
		r := &kgo.Record{Key: []byte("k"), Value: []byte(fmt.Sprintf("old%d", i)), Timestamp: old.Add(time.Duration(i) * time.Millisecond)}
		if err := prod.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, "a produce held by the destination", func() bool { return held.Load() > 0 })
	time.Sleep(500 * time.Millisecond) // the rest fetched and queued
	if n := x.inflightOf(k); n != 1 {
		t.Fatalf("%d batches of hour-old records in flight, want 1", n)
	}
	wake()
	x.waitCaughtUp("t", 1)
	x.requireMirrored("t", 1)
}
