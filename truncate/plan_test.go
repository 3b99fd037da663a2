package truncate

import (
	"reflect"
	"testing"

	"github.com/kmirror/kmirror/fetch"
)

// A->B breakpoints of a source with an aborted transaction at A offsets
// 10..14 and a commit marker at 20: B is contiguous.
var aToB = []fetch.Entry{{Src: 0, Dst: 0}, {Src: 15, Dst: 10}, {Src: 21, Dst: 15}}

func TestSwappedInvertsTheMapping(t *testing.T) {
	back := swapped(aToB)
	if want := []fetch.Entry{{Src: 0, Dst: 0}, {Src: 10, Dst: 15}, {Src: 15, Dst: 21}}; !reflect.DeepEqual(back, want) {
		t.Fatalf("swapped = %v, want %v", back, want)
	}
	// Every B offset below the end maps to the A offset of the same record.
	for b, a := range map[int64]int64{0: 0, 9: 9, 10: 15, 14: 19, 15: 21, 29: 35} {
		if got := translate(back, b, 30, 36); got != a {
			t.Errorf("B offset %d maps to A %d, want %d", b, got, a)
		}
	}
}

func TestTranslateFirstRecordAtOrAfter(t *testing.T) {
	for a, b := range map[int64]int64{0: 0, 9: 9, 10: 10, 12: 10, 14: 10, 15: 10, 20: 15, 21: 15, 30: 24, 40: 33} {
		if got := translate(aToB, a, 40, 33); got != b {
			t.Errorf("A offset %d translates to B %d, want %d", a, got, b)
		}
	}
}

func TestPlanDivergentCounts(t *testing.T) {
	p := Plan{Partitions: []PartitionPlan{{Divergent: 0}, {Divergent: 4}, {Divergent: 3}}}
	if !p.Divergent() || p.DivergentRecords() != 7 {
		t.Fatalf("divergent %t, records %d; want true, 7", p.Divergent(), p.DivergentRecords())
	}
	if (&Plan{Partitions: []PartitionPlan{{}}}).Divergent() {
		t.Fatal("a clean plan reports divergence")
	}
	if a, b := OffsetRange(7, 8), OffsetRange(7, 10); a != "offset 7" || b != "offsets 7..9" {
		t.Fatalf("OffsetRange: %q, %q", a, b)
	}
	if got := newest(map[int32]LastMirrored{0: {StoppedAtMs: 5}, 1: {StoppedAtMs: 9}}); got != 9 {
		t.Fatalf("newest = %d, want 9", got)
	}
}
