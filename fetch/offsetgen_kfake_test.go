package fetch

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// TestStaleGenerationWritesIgnored: an owner that lost its lease without
// noticing, or whose write the network delivered late, writes a
// checkpoint and a translation segment after the new owner did. Every
// record is stamped with its writer's lease generation, and a reader keeps
// the highest: the new owner's checkpoint and segment are the ones loaded,
// the stale records are counted, and a record of an older build (no
// stamp) is still taken as it was (issue 19: the latest record won, so the
// new owner's checkpoint was rolled back and its sealed segment
// overwritten).
func TestStaleGenerationWritesIgnored(t *testing.T) {
	x := newKfakePair(t)
	k := Key{Mirror: "m", Topic: "stale-gen", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg := func(entries ...Entry) []segRecord {
		return []segRecord{{base: entries[0].Src, value: encodeSegment(entries)}}
	}
	newOwner := update{key: k, gen: 20, cp: checkpoint{Src: 300, Dst: 310, Seq: 300, PID: 3}, segs: seg(Entry{Src: 0, Dst: 0}, Entry{Src: 100, Dst: 110})}
	stale := update{key: k, gen: 12, cp: checkpoint{Src: 150, Dst: 150, Seq: 150, PID: 3}, segs: seg(Entry{Src: 0, Dst: 0})}
	for _, up := range []update{newOwner, stale} {
		if err := x.e.store.writeUnleased(ctx, []update{up}); err != nil {
			t.Fatal(err)
		}
	}
	fresh := newOffsetStore(kafka.NewCluster("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.OffsetsTopic, nil)
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	cp, ok, xl, err := fresh.load(ctx, k, Entry{})
	if err != nil {
		t.Fatal(err)
	}
	if !ok || cp != newOwner.cp {
		t.Fatalf("loaded checkpoint %+v (%t), want the new owner's %+v: the stale one rolled it back", cp, ok, newOwner.cp)
	}
	if !slices.Contains(xl.Entries(), Entry{Src: 100, Dst: 110}) {
		t.Fatalf("translation %v lacks the new owner's breakpoint 100 -> 110: the stale segment overwrote it", xl.Entries())
	}
	if n := fresh.stale[k]; n != 2 {
		t.Fatalf("%d stale records counted, want the checkpoint and the segment", n)
	}
	// An older build's write (no stamp) is taken as before.
	old := update{key: k, cp: checkpoint{Src: 400, Dst: 410, Seq: 400, PID: 3}}
	if err := x.e.store.writeUnleased(ctx, []update{old}); err != nil {
		t.Fatal(err)
	}
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp, _ := fresh.checkpointOf(k); cp != old.cp {
		t.Fatalf("an unstamped checkpoint was not taken: %+v", cp)
	}
	// Forgetting the topic drops everything kept for the partition, its
	// generation and stale count included, and Bytes shrinks with it.
	before := fresh.Bytes()
	if err := fresh.forget(ctx, k.Mirror, k.Topic); err != nil {
		t.Fatal(err)
	}
	fresh.mu.Lock()
	_, hasGen := fresh.gens[k]
	_, hasStale := fresh.stale[k]
	fresh.mu.Unlock()
	if hasGen || hasStale {
		t.Fatalf("after forget the partition's generation (%t) or stale count (%t) is still kept", hasGen, hasStale)
	}
	if after := fresh.Bytes(); after >= before {
		t.Fatalf("store bytes %d after forget, %d before: want fewer", after, before)
	}
}

// TestStaleRecordWrittenAgain: an owner that lost its lease writes a
// checkpoint and a translation segment late, after the current owner's.
// Readers leave them aside by generation, but the offsets topic is
// compacted: once the cleaner ran only the latest record of each key is
// left, and that is the stale one. The current owner finds it and writes
// its own again, so the latest record of every key is its generation's
// (issue 19).
func TestStaleRecordWrittenAgain(t *testing.T) {
	defer func(d time.Duration) { restampCheck = d }(restampCheck)
	restampCheck = 100 * time.Millisecond
	x := newKfakePair(t)
	sp := x.mirroredAt("restamp", 20, 50)
	k := sp[0].Key
	waitUntil(t, 10*time.Second, "the owner's checkpoint at 50", func() bool {
		cp, ok := x.e.store.checkpointOf(k)
		return ok && cp.Src == 50
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stale := update{key: k, gen: 12, cp: checkpoint{Src: 10, Dst: 10, Seq: 10, PID: 3},
		segs: []segRecord{{base: 0, value: encodeSegment([]Entry{{Src: 0, Dst: 0}})}}}
	if err := x.e.store.writeUnleased(ctx, []update{stale}); err != nil {
		t.Fatal(err)
	}
	// The latest record of the checkpoint's key and of segment 0's key,
	// read as the cleaner would leave them.
	latest := func() (ckpt, seg uint64) {
		for _, r := range x.records(x.dst, x.e.cfg.OffsetsTopic, 1)[0] {
			var gen []byte
			for _, h := range r.Headers {
				if h.Key == GenerationHeader {
					gen = h.Value
				}
			}
			g := uint64(0)
			if len(gen) == 8 {
				g = binary.BigEndian.Uint64(gen)
			}
			kind, rk, extra, ok := parseKey(r.Key)
			if !ok || rk != k {
				continue
			}
			switch {
			case kind == kindCheckpoint:
				ckpt = g
			case kind == kindSegment && len(extra) == 1 && extra[0] == "0":
				seg = g
			}
		}
		return ckpt, seg
	}
	if c, s := latest(); c != 12 || s != 12 {
		t.Fatalf("right after the stale write the latest records are of generations %d and %d, want 12: the test wrote nothing stale", c, s)
	}
	waitUntil(t, 10*time.Second, "the owner's checkpoint and segment written again under generation 20", func() bool {
		c, s := latest()
		return c == 20 && s == 20
	})
	fresh := newOffsetStore(kafka.NewCluster("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.OffsetsTopic, nil)
	if err := fresh.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if cp, _ := fresh.checkpointOf(k); cp.Src != 50 {
		t.Fatalf("a reader takes checkpoint %+v, want the owner's at 50", cp)
	}
}

// TestStopRecordOnlyUnderTheLease: the last mirrored position a stop
// records in the state topic (read at failback) is written only under this
// member's lease: an owner whose lease ended while its stop job ran on
// writes nothing, and the record its successor wrote stays the one read
// (issue 19: the record was written with no lease, and the latest won).
func TestStopRecordOnlyUnderTheLease(t *testing.T) {
	x := newKfakePair(t)
	k := Key{Mirror: "m", Topic: "stale-stop", Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.e.RecordStopped(ctx, k, map[string]int64{"destination_offset": 310}); err != nil {
		t.Fatal(err)
	}
	x.ctl.mu.Lock()
	x.ctl.deadline = time.Now().Add(-time.Millisecond) // fenced
	x.ctl.mu.Unlock()
	if err := x.e.RecordStopped(ctx, k, map[string]int64{"destination_offset": 150}); err == nil {
		t.Fatal("a stop record was written after the lease ended")
	}
	recs, err := StoppedRecords(ctx, kafka.NewAdmin("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.StateTopic)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(recs[k]); got != `{"destination_offset":310}` {
		t.Fatalf("the state topic reads %s for %s; want the record written under the lease {\"destination_offset\":310}", got, k)
	}
}

// TestStateWriteRedialsBrokenConnection: a write connection that broke
// while idle (a broker restart) fails before a byte is sent; the write is
// made again on a new connection instead of failing (an add failed on
// "broken pipe" in CI), and the active record it wrote reads back.
func TestStateWriteRedialsBrokenConnection(t *testing.T) {
	x := newKfakePair(t)
	x.createTopic("t", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := newOffsetStore(kafka.NewCluster("destination cluster", x.dst.ListenAddrs(), "test", nil), x.e.cfg.StateTopic, nil)
	defer s.close()
	if err := s.writeActive(ctx, x.e.cfg.StateTopic, "m", "a", []byte(`{"mirror":"m"}`)); err != nil {
		t.Fatal(err)
	}
	s.wmu.Lock()
	s.wconn.Close() // broken under the store, as a restart leaves it
	s.wmu.Unlock()
	if err := s.writeActive(ctx, x.e.cfg.StateTopic, "m", "b", []byte(`{"mirror":"m"}`)); err != nil {
		t.Fatalf("write on a connection broken while idle: %v; want it made again on a new one", err)
	}
	if err := s.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if len(s.active) != 2 {
		t.Fatalf("active records read back: %d, want 2", len(s.active))
	}
}
