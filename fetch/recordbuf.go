package fetch

import (
	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// poisonReleasedRecords fills a record set with 0xA5 as it goes back to
// the pool (tests set it): a batch still aliasing it would then be sent,
// or compared, as garbage, which the engine's tests see.
var poisonReleasedRecords = false

// copySparseRecordSets copies out the batches of a record set they fill
// under half of (queueLocked); a test of the aliasing path turns it off.
var copySparseRecordSets = true

// queueLocked appends items, built from the record set records of one
// fetch answer, to p's queue and charges them to the memory budget: the
// record set by its capacity once, while any of its batches are queued
// or in flight (recordBuf); a re-encoded batch by its size. A record set
// no item aliases goes back to the pool at once.
func (e *Engine) queueLocked(p *partition, items []*item, records []byte) {
	buf := &recordBuf{b: records, charge: kwire.RecordsCap(records)}
	aliased := int64(0)
	for _, it := range items {
		if !it.owned && it.batch != nil {
			aliased += it.size
		}
	}
	if copySparseRecordSets && 2*aliased < buf.charge {
		// The batches kept are under half of what the set holds (mostly
		// skipped, aborted data or control batches): copied
		// out, so the charge stays within twice the queue's bytes, which
		// the per-partition limit (fetchWanted) counts.
		for _, it := range items {
			if !it.owned && it.batch != nil {
				it.batch = append(kwire.Batch(nil), it.batch...)
				it.owned = true
			}
		}
	}
	for _, it := range items {
		p.queue = append(p.queue, it)
		p.queued += it.size
		switch {
		case it.owned:
			e.inUse += it.size
		case it.batch != nil:
			it.buf = buf
			buf.refs++
		}
	}
	if buf.refs == 0 {
		releaseRecords(records)
		return
	}
	e.inUse += buf.charge
}

// dequeueLocked accounts for it leaving p's queue (acknowledged, skipped
// past, or dropped).
func (e *Engine) dequeueLocked(p *partition, it *item) {
	p.queued -= it.size
	if it.owned {
		e.inUse -= it.size
	}
	e.unrefLocked(it.buf)
}

// holdLocked keeps it's record set while a produce request carries it
// (collectProduce); answeredLocked lets go.
func holdLocked(it *item) {
	if it.buf != nil {
		it.buf.refs++
	}
}

// unrefLocked drops one use of b; the last gives it back to the pool and
// its bytes to the memory budget.
func (e *Engine) unrefLocked(b *recordBuf) {
	if b == nil {
		return
	}
	if b.refs--; b.refs > 0 {
		return
	}
	if b.refs < 0 || b.b == nil {
		// A bug in the counting: the set is already back in the pool
		// (or about to be reused), so it is left alone, not released
		// again; the daemon keeps running.
		if poisonReleasedRecords {
			panic("fetch: a record set released twice") // tests: fail loudly
		}
		e.log.Error("a fetched record set was released twice; please report this", zap.Int("refs", b.refs))
		return
	}
	e.inUse -= b.charge
	releaseRecords(b.b)
	b.b = nil
}

func releaseRecords(b []byte) {
	if poisonReleasedRecords {
		b = b[:cap(b)]
		for i := range b {
			b[i] = 0xA5
		}
	}
	kwire.ReleaseRecords(b)
}
