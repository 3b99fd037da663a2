package fetch

import (
	"context"
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
