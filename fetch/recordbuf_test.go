package fetch

import (
	"testing"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestQueuedRecordSetChargeBound: whatever share of a record set its
// queued batches fill, queueing charges the memory budget at most twice
// their bytes (the set's capacity when they fill at least half of it,
// their own size when they are copied out), and dequeueing them all gives
// the charge back; the set goes back to the pool once no batch aliases it
// (recordbuf.go; the bound is what the per-partition limit, fetchWanted,
// relies on).
func TestQueuedRecordSetChargeBound(t *testing.T) {
	for _, fill := range []int{1, 10, 49, 50, 51, 90, 100} { // percent of the set's capacity
		e := &Engine{}
		p := &partition{}
		records := make([]byte, 64<<10)
		used := len(records) * fill / 100
		var items []*item
		for off := 0; off < used; off += 1000 {
			n := min(1000, used-off)
			items = append(items, &item{batch: kwire.Batch(records[off : off+n]), size: int64(n)})
		}
		items = append(items, &item{}) // a skip item: no batch, no charge
		e.queueLocked(p, items, records)
		if p.queued != int64(used) {
			t.Fatalf("fill %d%%: queue counts %d bytes, want %d", fill, p.queued, used)
		}
		if e.inUse > 2*p.queued {
			t.Fatalf("fill %d%%: %d bytes queued charge %d to the budget (over twice)", fill, p.queued, e.inUse)
		}
		copied := 0
		for _, it := range items {
			if it.batch != nil && it.owned {
				copied++
				if &it.batch[0] == &records[0] || (it.buf != nil) {
					t.Fatalf("fill %d%%: a copied batch still aliases the set", fill)
				}
			}
		}
		if wantCopied := 2*used < len(records); wantCopied != (copied > 0) {
			t.Fatalf("fill %d%%: %d batches copied out, want copies %v", fill, copied, wantCopied)
		}
		for _, it := range items {
			e.dequeueLocked(p, it)
		}
		if e.inUse != 0 || p.queued != 0 {
			t.Fatalf("fill %d%%: %d bytes still charged, %d queued after every item left", fill, e.inUse, p.queued)
		}
	}
}
