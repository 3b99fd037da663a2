package fetch

import (
	"sort"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// item is one unit of the per-partition produce queue: a destination batch
// made from one source data batch, or a run of skipped source offsets
// (aborted or control batches) that only moves the mirrored position.
type item struct {
	batch kwire.Batch // nil: a skip item
	// srcFirst is the source offset of the batch's first record; srcOffsets
	// lists every record's source offset when they are not contiguous
	// (re-encoded batches), nil otherwise.
	srcFirst   int64
	srcOffsets []int64
	srcNext    int64 // source offset after this item
	count      int32
	epoch      int32 // source partition leader epoch of the batch
	seq        int32 // base sequence, fixed the first time the batch is sent
	seqSet     bool
	sentAt     time.Time // when it was last sent
	size       int64     // bytes of the batch (the queue's length counts them)
	// owned: the batch is a buffer of its own (re-encoded), charged to the
	// memory budget by size; otherwise it aliases its fetch's record set,
	// buf (nil outside the engine's queues), which is charged instead.
	owned bool
	buf   *recordBuf
	// converted: the batch was read from a legacy (v0/v1) message set
	// (kwire/legacy.go); counted when it is mirrored.
	converted bool
}

// recordBuf is one partition's record set from a fetch response
// (kwire.FetchResponse.Detach), which the batches queued from it alias
// without a copy (issue 20: copying every batch cost a tenth of the CPU).
// Its capacity is charged to the memory budget from when it is queued
// until it goes back to kwire's pool: when no queued item and no produce
// request in flight (sent.it, Engine.answeredLocked) uses it. Each
// partition's record sets are its own, so a partition that does not drain
// holds no other partition's bytes. refs and the charge are under the
// engine's lock.
type recordBuf struct {
	b      []byte
	refs   int   // queued items and in-flight holds on it
	charge int64 // bytes charged to the memory budget (kwire.RecordsCap)
}

func (it *item) skip() bool { return it.batch == nil }

// sourceOffset returns the source offset of the i-th record of the batch.
func (it *item) sourceOffset(i int) int64 {
	if it.srcOffsets != nil {
		return it.srcOffsets[i]
	}
	return it.srcFirst + int64(i)
}

// records decodes the item's records with their source offsets.
func (it *item) records() ([]kwire.Record, error) {
	recs, err := it.batch.Records()
	if err != nil {
		return nil, err
	}
	for i := range recs {
		recs[i].Offset = it.sourceOffset(i)
	}
	return recs, nil
}

// buildItems turns the record set fetched for a partition from offset
// `from` into produce-queue items, as a read_committed consumer would see
// it: control batches and batches of aborted transactions are skipped, and
// records below `from` are dropped. The result is a pure function of the
// source batches and `from`, which exact resume relies on. Batches
// forwarded as they are alias records (item.owned false): records must
// outlive them.
//
// next is the offset to fetch from afterwards; need > 0 means the record
// set ended in a partial batch of that size (the fetch size must grow).
func buildItems(records []byte, aborted []kwire.AbortedTxn, from int64) (items []*item, next int64, need int, err error) {
	batches, need, err := kwire.SplitBatches(records)
	if err != nil {
		return nil, from, 0, err
	}
	sort.Slice(aborted, func(i, j int) bool { return aborted[i].FirstOffset < aborted[j].FirstOffset })
	var open map[int64]bool // producers with an aborted transaction open; most fetches have none
	next = from
	skipTo := func(end int64) {
		if n := len(items); n > 0 && items[n-1].skip() {
			items[n-1].srcNext = end
			return
		}
		items = append(items, &item{srcFirst: next, srcNext: end})
	}
	ai := 0
	for _, b := range batches {
		last := b.LastOffset()
		if last < next {
			continue
		}
		for ai < len(aborted) && aborted[ai].FirstOffset <= last {
			if open == nil {
				open = map[int64]bool{}
			}
			open[aborted[ai].ProducerID] = true
			ai++
		}
		switch {
		case b.IsControl():
			abort, cerr := b.IsAbortMarker()
			if cerr != nil {
				return nil, from, 0, cerr
			}
			if abort {
				delete(open, b.ProducerID())
			}
			skipTo(last + 1)
		case b.IsTransactional() && open[b.ProducerID()]:
			skipTo(last + 1)
		case b.BaseOffset() >= next && b.Forwardable():
			// No copy: the batch aliases the record set, which the engine
			// keeps (recordBuf) while the batch is queued or in flight;
			// one converted from a legacy message set is its own buffer.
			converted := !kwire.Aliases(records, b)
			items = append(items, &item{batch: b[:len(b):len(b)], srcFirst: b.BaseOffset(), srcNext: last + 1,
				count: b.RecordCount(), epoch: b.LeaderEpoch(), size: int64(len(b)), owned: converted, converted: converted})
		default:
			it, rerr := reencode(b, next)
			if rerr != nil {
				return nil, from, 0, rerr
			}
			if it == nil {
				skipTo(last + 1)
			} else {
				it.converted = !kwire.Aliases(records, b)
				items = append(items, it)
			}
		}
		next = last + 1
	}
	return items, next, need, nil
}

// reencode rebuilds a batch that cannot be forwarded as is (compaction
// holes, LogAppendTime, or a start offset inside it) from its records at or
// after `from`, as a contiguous CreateTime batch with the same codec.
func reencode(b kwire.Batch, from int64) (*item, error) {
	recs, err := b.Records()
	if err != nil {
		return nil, err
	}
	keep := recs[:0]
	for _, r := range recs {
		if r.Offset >= from {
			keep = append(keep, r)
		}
	}
	if len(keep) == 0 {
		return nil, nil
	}
	nb, err := kwire.EncodeBatch(keep, b.Compression())
	if err != nil {
		return nil, err
	}
	offs := make([]int64, len(keep))
	for i, r := range keep {
		offs[i] = r.Offset
	}
	return &item{batch: nb, srcFirst: offs[0], srcOffsets: offs, srcNext: b.LastOffset() + 1,
		count: int32(len(keep)), epoch: b.LeaderEpoch(), size: int64(len(nb)), owned: true}, nil
}
