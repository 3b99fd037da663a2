package fetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestEngineMirrorsOnKfake mirrors a backlog and then live records, with
// the fetch loop on one fetch session (KIP-227) whose epoch advances.
func TestEngineMirrorsOnKfake(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 2)
	var mu sync.Mutex
	sessions := map[int32]int32{} // session ID -> highest epoch seen
	x.src.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Fetch}, Observe: true, Count: -1, When: func(r kmsg.Request) bool {
		f := r.(*kmsg.FetchRequest)
		mu.Lock()
		defer mu.Unlock()
		if f.SessionID != 0 && f.SessionEpoch > sessions[f.SessionID] {
			sessions[f.SessionID] = f.SessionEpoch
		}
		return true
	}})
	x.produce(x.src, "t", 0, 500)
	x.e.Assign(specs("t", 2))
	x.waitCaughtUp("t", 2)
	for round := range 4 {
		x.produce(x.src, "t", 500+100*round, 100)
		x.waitCaughtUp("t", 2)
	}
	// Only the engine has fetched from the source so far: one session,
	// whose epoch advanced with every fetch.
	mu.Lock()
	if len(sessions) != 1 {
		t.Fatalf("the fetch loop used %d fetch sessions (%v), want one kept across fetches", len(sessions), sessions)
	}
	for id, epoch := range sessions {
		if epoch < 4 {
			t.Fatalf("fetch session %d reached epoch %d only, want incremental fetches past epoch 4", id, epoch)
		}
	}
	mu.Unlock()
	x.requireMirrored("t", 2)
}

// TestEngineConfirmsBeforeResend answers a produce with REQUEST_TIMED_OUT
// after the broker appended it (as DelayedProduce does): the engine must
// read what landed instead of resending, so nothing is written twice.
func TestEngineConfirmsBeforeResend(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	// Every produce request's batches for t, by base sequence (kfake may
	// ask When more than once per request: requests are told apart by
	// pointer).
	var mu sync.Mutex
	seen := map[*kmsg.ProduceRequest]bool{}
	sent := map[int32]int{}
	x.dst.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1, When: func(r kmsg.Request) bool {
		req := r.(*kmsg.ProduceRequest)
		mu.Lock()
		defer mu.Unlock()
		if seen[req] {
			return true
		}
		seen[req] = true
		for _, tp := range req.Topics {
			for _, pp := range tp.Partitions {
				if tp.Topic == "t" && len(pp.Records) > 61 {
					sent[kwire.Batch(pp.Records).BaseSequence()]++
				}
			}
		}
		return true
	}})
	faulted := x.dst.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "t", Err: kerr.RequestTimedOut, Count: 3})
	x.produce(x.src, "t", 0, 300)
	x.e.Assign(specs("t", 1))
	x.waitCaughtUp("t", 1)
	x.produce(x.src, "t", 300, 300)
	x.waitCaughtUp("t", 1)
	if faulted.Hits() == 0 {
		t.Fatal("no produce was answered with REQUEST_TIMED_OUT: the test did not exercise confirm")
	}
	mu.Lock()
	for seq, n := range sent {
		if n > 1 {
			t.Fatalf("the batch at sequence %d was sent %d times: an appended batch answered REQUEST_TIMED_OUT must be found by confirm, not resent", seq, n)
		}
	}
	mu.Unlock()
	x.requireMirrored("t", 1)
}

// TestEngineDivergesOnForeignWrite writes a record into a mirrored
// destination partition with another producer: that partition stops as
// DIVERGED naming the writer, the other keeps mirroring.
func TestEngineDivergesOnForeignWrite(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 2)
	x.produce(x.src, "t", 0, 100)
	x.e.Assign(specs("t", 2))
	x.waitCaughtUp("t", 2)
	foreign := x.client(x.dst, kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := foreign.ProduceSync(context.Background(), &kgo.Record{Partition: 0, Value: []byte("not from the source")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	x.produce(x.src, "t", 100, 100)
	deadline := time.Now().Add(20 * time.Second)
	for {
		var p0, p1 Status
		for _, st := range x.e.Statuses() {
			if st.Key.Partition == 0 {
				p0 = st
			} else {
				p1 = st
			}
		}
		if p0.State == Diverged && p1.State == Mirroring && p1.Lag == 0 && p1.SourceEnd > 0 {
			if !strings.Contains(p0.Reason, "Another producer") {
				t.Fatalf("DIVERGED reason %q does not name the foreign writer", p0.Reason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 not DIVERGED or partition 1 not caught up: %+v", x.e.Statuses())
		}
		time.Sleep(10 * time.Millisecond)
	}
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	if got := x.ctl.states[Key{Mirror: "m", Topic: "t", Partition: 0}]; len(got) == 0 || got[len(got)-1] != Diverged {
		t.Fatalf("reports for partition 0: %v, want DIVERGED last", got)
	}
}

// TestEngineReleaseReturnsBudget releases caught-up partitions: each
// returns the destination's end as its position, its checkpoint is
// written, and the memory budget charged to fetched batches is back to 0.
func TestEngineReleaseReturnsBudget(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 3)
	x.produce(x.src, "t", 0, 900)
	x.e.Assign(specs("t", 3))
	x.waitCaughtUp("t", 3)
	for p := range int32(3) {
		k := Key{Mirror: "m", Topic: "t", Partition: p}
		pos, err := x.e.Release(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		end := x.dst.PartitionInfo("t", p).HighWatermark
		if pos.DestinationOffset != end || pos.SourceOffset != end {
			t.Fatalf("released %s at %+v, the destination ends at %d", k, pos, end)
		}
		if err := x.e.store.catchUp(context.Background()); err != nil {
			t.Fatal(err)
		}
		cp, ok := x.e.store.checkpointOf(k)
		if !ok || cp.Src != end || cp.Dst != end {
			t.Fatalf("checkpoint of %s after release: %+v (found %t), want %d", k, cp, ok, end)
		}
	}
	if held := x.e.Held(); len(held) != 0 {
		t.Fatalf("still held after release: %v", held)
	}
	// A fetch in flight holds its reservation until its answer is in (at
	// most FetchMaxWait): then nothing may stay charged.
	deadline := time.Now().Add(5 * time.Second)
	for {
		x.e.mu.Lock()
		inUse := x.e.inUse
		x.e.mu.Unlock()
		if inUse == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memory budget in use after every partition was released: %d bytes", inUse)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEngineTranslateBoundaries: a partition whose mirroring started at
// source offset 50 (--start-from latest then) translates from 50 on;
// below it the records were never mirrored and the answer says so; beyond
// the mirrored position there is no answer yet.
func TestEngineTranslateBoundaries(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	x.produce(x.src, "t", 0, 100)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.e.Assign([]Spec{{Key: k, StartOffset: 50}})
	deadline := time.Now().Add(20 * time.Second)
	for x.dst.PartitionInfo("t", 0).HighWatermark != 50 || x.e.Statuses()[0].Lag != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not caught up: %+v", x.e.Statuses())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []struct{ src, dst int64 }{{50, 0}, {75, 25}, {100, 50}} {
		if got, err := x.e.Translate(k, c.src); err != nil || got != c.dst {
			t.Fatalf("Translate(%d) = %d, %v; want %d", c.src, got, err, c.dst)
		}
	}
	var before *BeforeStartError
	if _, err := x.e.Translate(k, 10); !errors.As(err, &before) || !strings.Contains(err.Error(), "records 10..49 were never mirrored") {
		t.Fatalf("Translate(10) below the start offset 50: %v", err)
	}
	if _, err := x.e.Translate(k, 101); !errors.Is(err, ErrNotMirroredYet) {
		t.Fatalf("Translate(101) beyond the mirrored position: %v", err)
	}
	if _, err := x.e.Translate(Key{Mirror: "m", Topic: "t", Partition: 9}, 0); !errors.Is(err, ErrUnknownPartition) {
		t.Fatalf("Translate of a partition not held: %v", err)
	}
}

// TestCheckpointWriteSplitsLargeTranslations: a partition with 1,000,000
// breakpoints (a compacted source with a hole after every record) is
// written as translation segments in batches the offsets topic accepts
// (max.message.bytes 1 MiB), its checkpoint after them, and a fresh reader
// loads every breakpoint. Written as one batch it would fail with
// MESSAGE_TOO_LARGE forever.
func TestCheckpointWriteSplitsLargeTranslations(t *testing.T) {
	x := newKfakePair(t)
	k := Key{Mirror: "m", Topic: "holes", Partition: 0}
	const n = 1_000_000
	var xl Translation
	for i := int64(0); i < n; i++ {
		xl.Observe(2*i+1, i)
	}
	xl.Advance(2*n+1, n)
	segs, dropped := xl.takeUnsaved()
	size := 0
	for _, s := range segs {
		size += len(s.value)
	}
	if size < 1<<20 {
		t.Fatalf("the segments take %d bytes: not more than one batch may hold, the test proves nothing", size)
	}
	up := update{key: k, segs: segs, dropped: dropped, cp: checkpoint{Src: 2*n + 1, Dst: n, Seq: n, PID: 7}}
	other := update{key: Key{Mirror: "m", Topic: "plain", Partition: 3}, cp: checkpoint{Src: 5, Dst: 5, PID: 8}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.e.store.write(ctx, []update{up, other}); err != nil {
		t.Fatalf("write: %v", err)
	}
	fresh := newOffsetStore(kafka.NewCluster("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.OffsetsTopic, nil)
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	cp, ok, back, err := fresh.load(ctx, k, Entry{})
	if err != nil || !ok || cp != up.cp || back.Len() != n {
		t.Fatalf("read back checkpoint %+v (found %t, %v) with %d breakpoints; want %+v with %d", cp, ok, err, back.Len(), up.cp, n)
	}
	for _, o := range []int64{0, 1, 2, 3, 500_000, 2 * n} {
		a, _ := xl.Translate(o)
		b, _ := back.Translate(o)
		if a != b || a != (o)/2 {
			t.Fatalf("translate(%d): written %d, read back %d, want %d", o, a, b, o/2)
		}
	}
	if cp, ok := fresh.checkpointOf(other.key); !ok || cp != other.cp {
		t.Fatalf("the other partition's checkpoint: %+v, %t", cp, ok)
	}
	// The reader's memory holds where the segments are, not their bytes
	// (issue 18: every member folded every partition's translation into
	// its heap).
	if b := fresh.Bytes(); b > int64(size)/8 {
		t.Fatalf("the offsets store takes %d bytes for %d bytes of segments: it holds their values", b, size)
	}
	// A floor written with the checkpoint comes back with the translation.
	back.SetLimit(64 << 10)
	segs, dropped = back.takeUnsaved()
	up = update{key: k, segs: segs, dropped: dropped, cp: checkpoint{Src: 2*n + 1, Dst: n, Seq: n, PID: 7, Floor: back.Floor()}}
	if back.Floor() == 0 || len(dropped) == 0 {
		t.Fatalf("SetLimit dropped %d segments, floor %d", len(dropped), back.Floor())
	}
	if err := x.e.store.write(ctx, []update{up}); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	_, _, again, err := fresh.load(ctx, k, Entry{})
	if err != nil || again.Floor() != back.Floor() || again.Len() != back.Len() {
		t.Fatalf("read back floor %d with %d breakpoints (%v); want floor %d with %d", again.Floor(), again.Len(), err, back.Floor(), back.Len())
	}
	if d, ok := again.Translate(back.Floor() - 1); ok {
		t.Fatalf("offset %d below the floor %d translates to %d after a reload", back.Floor()-1, back.Floor(), d)
	}
}

// TestRetainSourcesForgetsDeletedMirrors: the source of a mirror that is
// gone, with no partition held, is forgotten and its fetch loops exit;
// a source still in use stays.
func TestRetainSourcesForgetsDeletedMirrors(t *testing.T) {
	x := newKfakePair(t)
	x.e.SetSource("gone", Source{Bootstrap: x.src.ListenAddrs()})
	x.e.RetainSources(map[string]bool{"m": true})
	x.e.mu.Lock()
	defer x.e.mu.Unlock()
	if _, ok := x.e.sources["gone"]; ok {
		t.Fatal("the deleted mirror's source is still held")
	}
	if _, ok := x.e.sources["m"]; !ok {
		t.Fatal("a kept mirror's source was forgotten")
	}
}

// TestEngineFailedBacksOff: a batch the destination refuses for good
// (MESSAGE_TOO_LARGE: its topic takes 1,000-byte batches, the source's is
// 5,000 bytes) fails the partition again right after every resume. The
// retries back off until a batch is acknowledged (a resume alone does not
// reset the backoff), and the reason names the batch size and the fix.
func TestEngineFailedBacksOff(t *testing.T) {
	x := newKfakePair(t)
	if err := x.src.CreateTopic("big", 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := x.dst.CreateTopic("big", 1, map[string]string{"max.message.bytes": "1000"}); err != nil {
		t.Fatal(err)
	}
	prod := x.client(x.src, kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err := prod.ProduceSync(context.Background(), &kgo.Record{Value: make([]byte, 5000)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	k := Key{Mirror: "m", Topic: "big", Partition: 0}
	x.e.Assign([]Spec{{Key: k}})
	time.Sleep(3 * time.Second)
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	failed := 0
	for _, s := range x.ctl.states[k] {
		if s == Failed {
			failed++
		}
	}
	// RetryBackoff is 20 ms: doubling from there, 3 s hold about 7
	// failures; a backoff reset by every resume would allow over 50.
	if failed < 2 || failed > 10 {
		t.Fatalf("%d FAILED reports in 3 s (states %v), want a growing backoff", failed, x.ctl.states[k])
	}
	if r := x.ctl.reasons[k]; !strings.Contains(r, "max.message.bytes") || !strings.Contains(r, "bytes") {
		t.Fatalf("reason %q does not name the size and the config to raise", r)
	}
}

// TestAdminOffsetsOneRequestPerLeader: add resolves the start offsets of
// a 200-partition topic with one ListOffsets request per partition leader
// (here 2), not one per partition on a new connection each.
func TestAdminOffsetsOneRequestPerLeader(t *testing.T) {
	cl, err := kfake.NewCluster(kfake.NumBrokers(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.CreateTopic("wide", 200, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	requests := map[kmsg.Request]bool{} // kfake may ask When more than once per request
	cl.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.ListOffsets}, Observe: true, Count: -1, When: func(r kmsg.Request) bool {
		mu.Lock()
		requests[r] = true
		mu.Unlock()
		return true
	}})
	a := kafka.NewAdmin("source cluster", cl.ListenAddrs(), "test", nil)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offs, err := a.Offsets(ctx, "wide", 200, kafka.Latest)
	if err != nil || len(offs) != 200 {
		t.Fatalf("offsets: %d, %v", len(offs), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(requests) == 0 || len(requests) > 2 {
		t.Fatalf("%d ListOffsets requests for 200 partitions on 2 brokers, want one per leader", len(requests))
	}
}

// TestEngineAcceptGapWithoutGap: a FAILED partition resumed with a gap
// permission when the source has no gap uses the permission up (an empty
// gap recorded) and fails again for its real cause, not DIVERGED over an
// invented gap.
func TestEngineAcceptGapWithoutGap(t *testing.T) {
	x := newKfakePair(t)
	if err := x.src.CreateTopic("big", 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := x.dst.CreateTopic("big", 1, map[string]string{"max.message.bytes": "1000"}); err != nil {
		t.Fatal(err)
	}
	x.produce(x.src, "big", 0, 5)
	prod := x.client(x.src, kgo.DefaultProduceTopic("big"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err := prod.ProduceSync(context.Background(), &kgo.Record{Value: make([]byte, 5000)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	k := Key{Mirror: "m", Topic: "big", Partition: 0}
	x.e.Assign([]Spec{{Key: k, Generation: 1}})
	waitState := func(want State) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			x.ctl.mu.Lock()
			st := x.ctl.states[k]
			x.ctl.mu.Unlock()
			if len(st) > 0 && st[len(st)-1] == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("states %v, want %s last", st, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitState(Failed)
	x.ctl.mu.Lock()
	x.ctl.states[k] = nil
	x.ctl.mu.Unlock()
	x.e.Assign([]Spec{{Key: k, Generation: 2, AcceptGap: true, AcceptGapBelow: 1}})
	waitState(Failed)
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	for _, s := range x.ctl.states[k] {
		if s == Diverged {
			t.Fatalf("DIVERGED after resuming without a gap: %q", x.ctl.reasons[k])
		}
	}
	if len(x.ctl.gaps) != 1 || x.ctl.gaps[0][0] != x.ctl.gaps[0][1] {
		t.Fatalf("gaps recorded %v, want one empty gap (the permission used up)", x.ctl.gaps)
	}
}

// TestEngineSeedContinuesWithoutCopying: a partition seeded at a last
// mirrored position (failback, re-add) starts there: the destination's
// existing records are not copied again, only the source's later ones,
// and the seeded translation maps group commits below that position
// exactly; TranslateCommitted caps a commit past the mirrored position
// at the destination end.
func TestEngineSeedContinuesWithoutCopying(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	// The destination already holds 30 records; they copy source records
	// 0..9 and 15..34 (a hole at 10..14, as an aborted transaction
	// leaves), and the source has 20 more records after them.
	x.produce(x.dst, "t", 0, 30)
	x.produce(x.src, "t", 0, 55)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.e.Seed(ctx, k, Entry{Src: 35, Dst: 30}, -1, []Entry{{Src: 0, Dst: 0}, {Src: 15, Dst: 10}}); err != nil {
		t.Fatal(err)
	}
	x.e.Assign([]Spec{{Key: k}})
	deadline := time.Now().Add(20 * time.Second)
	for x.dst.PartitionInfo("t", 0).HighWatermark != 50 || len(x.e.Statuses()) == 0 || x.e.Statuses()[0].Lag != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not caught up: destination at %d, %+v", x.dst.PartitionInfo("t", 0).HighWatermark, x.e.Statuses())
		}
		time.Sleep(10 * time.Millisecond)
	}
	src, dst := x.records(x.src, "t", 1)[0], x.records(x.dst, "t", 1)[0]
	for i := 30; i < 50; i++ {
		if string(dst[i].Value) != string(src[i+5].Value) {
			t.Fatalf("destination offset %d holds %q, want source offset %d's %q", i, dst[i].Value, i+5, src[i+5].Value)
		}
	}
	for _, c := range []struct {
		src, dst int64
		capped   bool
	}{{0, 0, false}, {9, 9, false}, {12, 10, false}, {15, 10, false}, {35, 30, false}, {54, 49, false}, {55, 50, false}, {90, 50, true}} {
		d, capped, err := x.e.TranslateCommitted(k, c.src)
		if err != nil || d != c.dst || capped != c.capped {
			t.Fatalf("TranslateCommitted(%d) = %d, %t, %v; want %d, %t", c.src, d, capped, err, c.dst, c.capped)
		}
	}
}

// TestResumeWithoutWalkKeepsLeaderEpoch: a partition that resumes at its
// checkpoint with nothing to walk keeps the checkpoint's source leader
// epoch as that of its last mirrored batch. A default of 0 made the next
// source leader change look like an unclean truncation (epoch 0 ended
// long before the mirrored position).
func TestResumeWithoutWalkKeepsLeaderEpoch(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	x.produce(x.src, "t", 0, 10)
	x.produce(x.dst, "t", 0, 10)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := x.e.Seed(ctx, k, Entry{Src: 10, Dst: 10}, 7, nil); err != nil {
		t.Fatal(err)
	}
	x.e.Assign([]Spec{{Key: k}})
	deadline := time.Now().Add(10 * time.Second)
	for {
		sts := x.e.Statuses()
		if len(sts) == 1 && sts[0].State == Mirroring {
			if got := sts[0].Position.SourceLeaderEpoch; got != 7 {
				t.Fatalf("resumed with source leader epoch %d, want the checkpoint's 7", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not mirroring: %+v", sts)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSetSourceReroutes replaces a mirror's source settings (new security
// key, as kmirror alter does) while it mirrors: the partitions must move
// to fetch loops of the new source and keep mirroring, not stall on the
// loops of the replaced one.
func TestSetSourceReroutes(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 2)
	x.produce(x.src, "t", 0, 200)
	x.e.Assign(specs("t", 2))
	x.waitCaughtUp("t", 2)
	dials := 0
	x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), SecurityKey: "rotated", Security: func() (*kwire.Security, error) {
		dials++ // read under the cluster's lock or a single fetch loop
		return nil, nil
	}})
	x.produce(x.src, "t", 200, 100)
	x.waitCaughtUp("t", 2)
	x.requireMirrored("t", 2)
	if dials == 0 {
		t.Fatal("the new source's security settings were never used: the partitions did not reconnect")
	}
}

// TestStartRetriesRetriableErrors: the first read of the offsets topic at
// start meets UNKNOWN_LEADER_EPOCH (normal for a just-created partition);
// Start retries it instead of failing, which made a new member exit
// (issue 18).
func TestStartRetriesRetriableErrors(t *testing.T) {
	dst, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	injected := 0
	dst.ControlKey(int16(kmsg.Fetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition, sp.ErrorCode, sp.HighWatermark, sp.LastStableOffset = rp.Partition, kerr.UnknownLeaderEpoch.Code, -1, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		injected++
		return resp, nil, true
	})
	e := New(Config{Destination: dst.ListenAddrs(), Checkpoint: 100 * time.Millisecond}, newFakeControl(), zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		t.Fatalf("start after one UNKNOWN_LEADER_EPOCH: %v", err)
	}
	defer e.Close(ctx) //nolint:errcheck // nothing held
	if injected != 1 {
		t.Fatalf("the injected error was answered %d times, want 1 (the test did not exercise the retry)", injected)
	}
}

// TestCheckpointWrittenOnlyUnderTheLease: a checkpoint round after this
// member's lease ended sends nothing (the partition is retried, as after
// a failed write), so an owner that lost its lease cannot roll the next
// owner's checkpoint back; under the lease again, it is written, on a
// connection whose unacknowledged bytes the kernel gives up after
// produce_timeout + 1s (issue 19).
func TestCheckpointWrittenOnlyUnderTheLease(t *testing.T) {
	x := newKfakePair(t)
	k := Key{Mirror: "m", Topic: "lease-gate", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up := update{key: k, cp: checkpoint{Src: 10, Dst: 10, PID: 3}}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond)
	x.ctl.mu.Unlock()
	err := x.e.store.write(ctx, []update{up})
	var werr *WriteError
	if !errors.As(err, &werr) || !werr.Failed[k] || !errors.Is(err, errNoLease) {
		t.Fatalf("write after the lease: %v; want a WriteError for %s naming the lease", err, k)
	}
	fresh := newOffsetStore(kafka.NewCluster("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.OffsetsTopic, nil)
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp, ok := fresh.checkpointOf(k); ok {
		t.Fatalf("checkpoint %+v was written after the lease", cp)
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{}
	x.ctl.mu.Unlock()
	if err := x.e.store.write(ctx, []update{up}); err != nil {
		t.Fatalf("write under the lease: %v", err)
	}
	// Its connection gives unacknowledged bytes up as produce
	// connections do, instead of retransmitting them after the lease.
	x.e.store.wmu.Lock()
	ut, err := x.e.store.wconn.UserTimeout()
	x.e.store.wmu.Unlock()
	if want := x.e.cfg.ProduceTimeout + time.Second; err != nil || ut != want {
		t.Fatalf("checkpoint connection's TCP_USER_TIMEOUT %v (%v), want produce_timeout + 1s = %v", ut, err, want)
	}
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp, ok := fresh.checkpointOf(k); !ok || cp != up.cp {
		t.Fatalf("checkpoint under the lease: %+v, %t", cp, ok)
	}
}

// TestNewGenerationReReportsState: the control plane refuses a report
// under an older generation, so when the generation moves under a held
// partition the engine tells its state again under the new one (else a
// FAILED told just before the move stays shown while it mirrors).
func TestNewGenerationReReportsState(t *testing.T) {
	x := newKfakePair(t)
	sp := x.mirroredAt("g", 1, 50)
	k := sp[0].Key
	x.ctl.mu.Lock()
	pid := x.ctl.saved[k]
	sp[0].Producer = &pid // the same producer identity: no resume
	x.ctl.mu.Unlock()
	sp[0].Generation = 2
	x.e.Assign(sp)
	waitUntil(t, 10*time.Second, "a MIRRORING report under generation 2", func() bool {
		x.ctl.mu.Lock()
		defer x.ctl.mu.Unlock()
		st, gens := x.ctl.states[k], x.ctl.gens[k]
		return len(st) > 0 && st[len(st)-1] == Mirroring && gens[len(gens)-1] == 2
	})
	// The same generation again tells nothing new.
	x.ctl.mu.Lock()
	n := len(x.ctl.states[k])
	x.ctl.mu.Unlock()
	x.e.Assign(sp)
	time.Sleep(200 * time.Millisecond)
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	if got := len(x.ctl.states[k]); got != n {
		t.Fatalf("an Assign with an unchanged generation queued %d reports", got-n)
	}
}

// TestStartWaitsForTheDestination: a destination that is not up yet (or
// answers NOT_CONTROLLER while creating the internal topics) is retried
// until it answers; the member does not exit (issue 18).
func TestStartWaitsForTheDestination(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there until the cluster starts
	e := New(Config{Destination: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Checkpoint: 100 * time.Millisecond}, newFakeControl(), zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	started := make(chan error, 1)
	go func() { started <- e.Start(ctx) }()
	time.Sleep(1500 * time.Millisecond) // several refused dials
	select {
	case err := <-started:
		t.Fatalf("Start returned before the destination was up: %v", err)
	default:
	}
	dst, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	refused := 0
	dst.ControlKey(int16(kmsg.CreateTopics), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		req := kr.(*kmsg.CreateTopicsRequest)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic, st.ErrorCode = rt.Topic, kerr.NotController.Code
			resp.Topics = append(resp.Topics, st)
		}
		refused++
		return resp, nil, true
	})
	if err := <-started; err != nil {
		t.Fatalf("start once the destination is up: %v", err)
	}
	defer e.Close(ctx) //nolint:errcheck // nothing held
	if refused != 1 {
		t.Fatalf("NOT_CONTROLLER was answered %d times, want 1 (the test did not exercise the retry)", refused)
	}
}

// TestNewGenerationWalksFromTheDestination: a partition held here gets a
// new generation under the same producer identity after another member
// owned it meanwhile and wrote under that identity (a takeover keeps it,
// fetch/DESIGN.md section 3) while this engine was fenced and kept its
// in-memory position (a reconcile that read the state before the fence
// assigned it after the fence's drop). The spec's fence count says so: the engine resumes with a walk
// instead of trusting that position: no renewal is needed, its checkpoint
// never moves back behind the other owner's, and the destination equals
// the source record by record (issue 19: the generation was updated in
// place). A new generation with no fence between (a rebalance that kept
// the partition here) is taken in place, without a restart: a walk there
// turned a handoff inexact (TestGroupJoinDrainLeave).
func TestNewGenerationWalksFromTheDestination(t *testing.T) {
	x := newKfakePair(t)
	sp := x.mirroredAt("g", 1, 50)
	k := sp[0].Key
	starts := func() int {
		x.e.mu.Lock()
		defer x.e.mu.Unlock()
		return x.e.parts[k].gen
	}
	before := starts()
	x.ctl.mu.Lock()
	pid := x.ctl.saved[k]
	x.ctl.mu.Unlock()
	sp[0].Generation, sp[0].Producer = 2, &pid // no fence between: in place
	x.e.Assign(sp)
	if n := starts(); n != before {
		t.Fatalf("a new generation with no fence between restarted the partition (%d starts, was %d)", n, before)
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond) // fenced: this member lost its lease
	x.ctl.losses++
	x.ctl.mu.Unlock()
	x.produce(x.src, "g", 50, 30)
	time.Sleep(300 * time.Millisecond) // fetched and queued here, not sent

	// Another owner takes over under the same identity and mirrors them.
	ctl2 := newFakeControl()
	e2 := New(Config{Destination: x.dst.ListenAddrs(), Checkpoint: 100 * time.Millisecond, RetryBackoff: 20 * time.Millisecond}, ctl2, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e2.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e2.SetSource("m", Source{Bootstrap: x.src.ListenAddrs()})
	sp2 := specs("g", 1)
	sp2[0].Generation, sp2[0].Producer = 3, &pid
	e2.Assign(sp2)
	waitUntil(t, 20*time.Second, "the other owner's checkpoint at 80", func() bool {
		pos, ok, err := e2.Checkpointed(ctx, k)
		return err == nil && ok && pos.SourceOffset == 80
	})
	if err := e2.Drop(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := e2.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// The partition comes back here under a new generation.
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Time{}
	x.ctl.mu.Unlock()
	sp[0].Generation, sp[0].Producer, sp[0].Fences = 4, &pid, 1
	x.e.Assign(sp)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		pos, ok, err := x.e.Checkpointed(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if ok && pos.SourceOffset < 80 {
			t.Fatalf("the checkpoint moved back to %d behind the other owner's 80", pos.SourceOffset)
		}
		time.Sleep(20 * time.Millisecond)
	}
	x.produce(x.src, "g", 80, 20)
	x.waitCaughtUp("g", 1)
	x.requireMirrored("g", 1)
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	if len(x.ctl.renewals) > 0 {
		t.Fatalf("the resume needed a producer renewal (%v): it sent from its stale position", x.ctl.renewals)
	}
}

// TestStartRetriesLeadershipChangesQuietly: a destination broker that
// answers NOT_LEADER_OR_FOLLOWER for a partition it was just named leader
// of (a topic just created: its leaders are not in every broker's own
// state yet) makes the start retry from fresh metadata without reporting
// FAILED (make bench saw 3,000 of 10,000 new partitions go FAILED, each a
// warning and a raft command); the partition then mirrors.
func TestStartRetriesLeadershipChangesQuietly(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("q", 1)
	x.produce(x.src, "q", 0, 30)
	var refused atomic.Int32
	refuse := func(kr kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		if refused.Load() >= 2 {
			return nil, nil, false
		}
		if req, ok := kr.(*kmsg.FetchRequest); ok { // the start's walk of the destination
			resp := req.ResponseKind().(*kmsg.FetchResponse)
			for _, rt := range req.Topics {
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					sp := kmsg.NewFetchResponseTopicPartition()
					sp.Partition, sp.ErrorCode = rp.Partition, kerr.NotLeaderForPartition.Code
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			refused.Add(1)
			return resp, nil, true
		}
		return nil, nil, false
	}
	x.dst.ControlKey(int16(kmsg.Fetch), refuse)
	x.e.Assign(specs("q", 1))
	x.waitCaughtUp("q", 1)
	x.requireMirrored("q", 1)
	if refused.Load() == 0 {
		t.Fatal("the destination refused nothing: the start never met the leadership change")
	}
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	for _, s := range x.ctl.states[Key{Mirror: "m", Topic: "q", Partition: 0}] {
		if s == Failed {
			t.Fatalf("reported FAILED on a leadership change at start (states %v)", x.ctl.states)
		}
	}
}
