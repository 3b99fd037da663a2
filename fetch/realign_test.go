package fetch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// deleteRecordsKfake moves a partition's log start to offset.
func (x *kfakePair) deleteRecords(cl *kfake.Cluster, topic string, offset int64) {
	x.t.Helper()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics, req.TimeoutMillis = append(req.Topics, rt), 10000
	res, err := req.RequestWith(context.Background(), x.client(cl))
	if err != nil {
		x.t.Fatal(err)
	}
	if p := res.Topics[0].Partitions[0]; p.ErrorCode != 0 || p.LowWatermark != offset {
		x.t.Fatalf("delete records of %s below %d: error %d, log start %d", topic, offset, p.ErrorCode, p.LowWatermark)
	}
}

// produceBatches writes n records from `from` to topic on cl, size records
// per batch.
func (x *kfakePair) produceBatches(cl *kfake.Cluster, topic string, from, n, size int) {
	x.t.Helper()
	prod := x.client(cl, kgo.DefaultProduceTopic(topic))
	for i := from; i < from+n; i += size {
		var recs []*kgo.Record
		for j := i; j < min(i+size, from+n); j++ {
			recs = append(recs, &kgo.Record{Key: []byte{byte(j)}, Value: []byte(strings.Repeat("v", j+1))})
		}
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			x.t.Fatal(err)
		}
	}
}

// mirrorThenRelease mirrors topic's partition 0 until caught up, releases
// it, and returns kmirror's producer identity for it.
func (x *kfakePair) mirrorThenRelease(topic string) (Key, kafka.ProducerID) {
	x.t.Helper()
	k := Key{Mirror: "m", Topic: topic, Partition: 0}
	x.e.Assign([]Spec{{Key: k, Generation: 1}})
	x.waitCaughtUp(topic, 1)
	if _, err := x.e.Release(context.Background(), k); err != nil {
		x.t.Fatal(err)
	}
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	return k, x.ctl.saved[k]
}

// walkFromStart walks k from offset 0 on both sides, as a takeover with no
// checkpoint does.
func (x *kfakePair) walkFromStart(k Key, pid kafka.ProducerID, gapBelow int64) (walkResult, error) {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var xl Translation
	return x.e.walk(ctx, x.e.sources[k.Mirror].cl, k, Entry{}, -1, pid, ownSeqs{pid: 0}, &xl, gapBelow)
}

// TestWalkRealignsAfterSourceDeleted: the source deleted records kmirror
// had mirrored (inside a batch, as DeleteRecords may); the walk from the
// start accepts kmirror's batches before the first surviving one, verifies
// from it, and ends at the source's end with the next sequence.
func TestWalkRealignsAfterSourceDeleted(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	x.produceBatches(x.src, "t", 0, 30, 10)
	k, pid := x.mirrorThenRelease("t")
	x.deleteRecords(x.src, "t", 25)
	w, err := x.walkFromStart(k, pid, -1)
	if err != nil {
		t.Fatalf("walk after the source deleted mirrored records: %v", err)
	}
	if w.end != (Entry{Src: 30, Dst: 30}) || w.nextSeq != 30 || w.walked != 30 || w.gap != nil || len(w.duplicates) != 0 {
		t.Fatalf("walk ended at %+v, next sequence %d, walked %d, gap %v, duplicates %v; want 30/30, 30, 30, none",
			w.end, w.nextSeq, w.walked, w.gap, w.duplicates)
	}
}

// TestWalkRealignBothSidesDeleted: destination retention deleted some or
// all of kmirror's copies too. The walk continues the sequence over the
// destination's deleted offsets and ends at the source's end either way.
func TestWalkRealignBothSidesDeleted(t *testing.T) {
	for _, c := range []struct {
		name                     string
		dstLogStart, srcLogStart int64
	}{
		{"the copy of the first surviving batch still there", 20, 25},
		{"every copy deleted", 30, 25},
	} {
		t.Run(c.name, func(t *testing.T) {
			x := newKfakePair(t)
			x.createTopic("b", 1)
			x.produceBatches(x.src, "b", 0, 30, 10)
			k, pid := x.mirrorThenRelease("b")
			x.deleteRecords(x.dst, "b", c.dstLogStart)
			x.deleteRecords(x.src, "b", c.srcLogStart)
			w, err := x.walkFromStart(k, pid, -1)
			if err != nil {
				t.Fatalf("walk: %v", err)
			}
			if w.end != (Entry{Src: 30, Dst: 30}) || w.nextSeq != 30 || w.walked != 30 {
				t.Fatalf("walk ended at %+v, next sequence %d, walked %d; want 30/30, 30, 30", w.end, w.nextSeq, w.walked)
			}
		})
	}
}

// TestWalkRealignGapAndForeign: records deleted before kmirror copied them
// are a gap (DIVERGED with the source's log start, or skipped when the
// operator accepted it), kmirror's copies before them are kept; a batch of
// another producer among the unverifiable ones is never accepted.
func TestWalkRealignGapAndForeign(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("g", 1)
	x.produceBatches(x.src, "g", 0, 20, 10)
	k, pid := x.mirrorThenRelease("g")
	x.produceBatches(x.src, "g", 20, 20, 10) // never mirrored
	x.deleteRecords(x.src, "g", 30)

	_, err := x.walkFromStart(k, pid, -1)
	var dv *Divergence
	if !errors.As(err, &dv) || dv.GapBelow != 30 || !strings.Contains(dv.Reason, "source offsets 20..29") ||
		!strings.Contains(dv.Reason, "kmirror's copies on the destination (offsets 0..19, written after its last checkpoint) stand for 20 of them") {
		t.Fatalf("walk over a real gap: %v; want a gap 20..29 below log start 30 that keeps kmirror's copies", err)
	}
	w, err := x.walkFromStart(k, pid, 30)
	if err != nil || w.gap == nil || *w.gap != (gapRange{from: 20, to: 30}) || w.end != (Entry{Src: 30, Dst: 20}) || w.nextSeq != 20 {
		t.Fatalf("walk with the gap accepted: %+v, %v; want gap 20..29, end 30/20, next sequence 20", w, err)
	}
	if _, err := x.walkFromStart(k, pid, 29); !errors.As(err, &dv) || dv.GapBelow != 30 {
		t.Fatalf("walk with a smaller gap accepted: %v; want DIVERGED again", err)
	}

	x.createTopic("f", 1)
	x.produceBatches(x.src, "f", 0, 20, 10)
	fk, fpid := x.mirrorThenRelease("f")
	x.produceBatches(x.dst, "f", 100, 1, 1) // a foreign write
	x.produceBatches(x.src, "f", 20, 10, 10)
	x.deleteRecords(x.src, "f", 25)
	if _, err := x.walkFromStart(fk, fpid, 0); !errors.As(err, &dv) || !strings.Contains(dv.Reason, "destination offset 20 past kmirror's last checkpoint") ||
		!strings.Contains(dv.Reason, "Another producer has written") {
		t.Fatalf("walk over a foreign batch: %v; want DIVERGED naming the foreign write", err)
	}
}

// TestWalkRealignRefusesRepeatedContent: when the source's first surviving
// batch has the same records as more than one of kmirror's batches, or as
// one while the destination might as well hold no copy of it (the records
// before it deleted unmirrored), any choice could lose or duplicate
// records: DIVERGED, never a silent pick.
func TestWalkRealignRefusesRepeatedContent(t *testing.T) {
	x := newKfakePair(t)
	same := func(topic string, n int) []*kgo.Record {
		var recs []*kgo.Record
		for range n {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("same"), Timestamp: time.UnixMilli(1700000000000)})
		}
		return recs
	}
	prod := x.client(x.src)
	produce := func(recs []*kgo.Record) {
		t.Helper()
		if err := prod.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// One copy fits, and so does none: 0..4 and E mirrored; 6..15 and E
	// again written while kmirror was down; the source deleted up to the
	// second E. Taking the first E as its copy would lose 6..15 silently.
	x.createTopic("one", 1)
	x.produceBatches(x.src, "one", 0, 5, 5)
	produce(same("one", 1))
	k, pid := x.mirrorThenRelease("one")
	x.produceBatches(x.src, "one", 6, 10, 10)
	produce(same("one", 1))
	x.deleteRecords(x.src, "one", 16)
	var dv *Divergence
	if _, err := x.walkFromStart(k, pid, 0); !errors.As(err, &dv) || !strings.Contains(dv.Reason, "cannot be told") {
		t.Fatalf("walk with one copy or none fitting: %v; want DIVERGED, cannot be told", err)
	}
	// Two copies fit: two identical batches, the source's first surviving
	// batch is the second.
	x.createTopic("two", 1)
	produce(same("two", 10))
	produce(same("two", 10))
	k2, pid2 := x.mirrorThenRelease("two")
	x.produceBatches(x.src, "two", 20, 10, 10)
	x.deleteRecords(x.src, "two", 15)
	if _, err := x.walkFromStart(k2, pid2, 0); !errors.As(err, &dv) || !strings.Contains(dv.Reason, "destination offset 0, 10") {
		t.Fatalf("walk with two copies fitting: %v; want DIVERGED naming both", err)
	}
}

// TestRecordsDigest: what a copy keeps decides the digest; null and empty
// keys, values and headers are told apart.
func TestRecordsDigest(t *testing.T) {
	base := []kwire.Record{{Timestamp: 1, Key: []byte("k"), Value: []byte("v"), Headers: []kwire.Header{{Key: "h", Value: []byte("x")}}}}
	same := []kwire.Record{{Offset: 99, Timestamp: 1, Key: []byte("k"), Value: []byte("v"), Headers: []kwire.Header{{Key: "h", Value: []byte("x")}}}}
	if recordsDigest(base) != recordsDigest(same) {
		t.Fatal("records that differ only in offset have different digests")
	}
	for name, other := range map[string][]kwire.Record{
		"timestamp":   {{Timestamp: 2, Key: []byte("k"), Value: []byte("v"), Headers: base[0].Headers}},
		"null key":    {{Timestamp: 1, Key: nil, Value: []byte("v"), Headers: base[0].Headers}},
		"empty value": {{Timestamp: 1, Key: []byte("k"), Value: []byte{}, Headers: base[0].Headers}},
		"null header": {{Timestamp: 1, Key: []byte("k"), Value: []byte("v"), Headers: []kwire.Header{{Key: "h"}}}},
		"no header":   {{Timestamp: 1, Key: []byte("k"), Value: []byte("v")}},
		"two records": append(append([]kwire.Record{}, base...), base...),
		"moved bytes": {{Timestamp: 1, Key: []byte("kv"), Value: []byte{}, Headers: base[0].Headers}},
	} {
		if recordsDigest(other) == recordsDigest(base) {
			t.Errorf("%s: same digest as the base record", name)
		}
	}
}

// TestSessionRestartedPartition: a partition restarted at the offset its
// fetch session holds is named as restarted, so its source end comes from
// the session's last answer (KIP-227 answers only changed partitions),
// and nothing is sent again for it.
func TestSessionRestartedPartition(t *testing.T) {
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	run1, run2 := &partition{}, &partition{}
	want := func(p *partition, gen int) map[Key]fetchWant {
		return map[Key]fetchWant{k: {FetchPartition: kwire.FetchPartition{Topic: "t", Offset: 150}, run: p, gen: gen}}
	}
	s := session{parts: map[Key]fetchWant{}, ends: map[Key]sourceEnd{}}
	var req kwire.FetchRequest
	if r := s.build(&req, want(run1, 1)); len(r) != 0 || len(req.Partitions) != 1 {
		t.Fatalf("full fetch: %+v, restarted %v", req, r)
	}
	s.advance(want(run1, 1), 7, "m", []kwire.FetchedPartition{{Topic: "t", LastStableOffset: 150, HighWatermark: 152}})
	if s.ends[k] != (sourceEnd{lso: 150, hw: 152}) {
		t.Fatalf("ends after the answer: %v", s.ends)
	}
	for _, c := range []struct {
		name      string
		want      map[Key]fetchWant
		restarted bool
	}{
		{"unchanged", want(run1, 1), false},
		{"same run, new generation", want(run1, 2), true},
		{"a new run", want(run2, 2), true},
		{"unchanged again", want(run2, 2), false},
	} {
		req = kwire.FetchRequest{}
		r := s.build(&req, c.want)
		if (len(r) == 1) != c.restarted || len(req.Partitions) != 0 || len(req.Forgotten) != 0 {
			t.Fatalf("%s: restarted %v, %d partitions and %d forgotten sent", c.name, r, len(req.Partitions), len(req.Forgotten))
		}
		s.advance(c.want, 7, "m", nil)
	}
	req = kwire.FetchRequest{}
	s.build(&req, map[Key]fetchWant{})
	if len(req.Forgotten) != 1 || len(s.ends) != 0 {
		t.Fatalf("dropping the partition: %d forgotten, ends %v; want it forgotten and its end dropped", len(req.Forgotten), s.ends)
	}
}
