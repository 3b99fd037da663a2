package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// The walk: reading the source and the destination side by side from a
// known position, as resume, confirm and settle do (DESIGN.md).

// walkResult is where a walk ended.
type walkResult struct {
	end     Entry // next source offset and destination offset (the log end)
	epoch   int32
	nextSeq int32   // next sequence of the walk's current producer identity
	own     ownSeqs // every own identity's next sequence at the end
	entries []Entry
	walked  int64
	// duplicates are batches of kmirror's own producer identity found again
	// on the destination; the walk steps over them.
	duplicates []duplicate
	// gap is the source range the walk skipped under AcceptGap, if any.
	gap *gapRange
	// realigned: the walk went on past source records deleted after its
	// start (realign.go); its end is worth a checkpoint at once, so a
	// crash does not make the next walk do it again.
	realigned bool
}

// gapRange is source offsets from..to-1, deleted on the source before they
// were mirrored and skipped with the operator's permission.
type gapRange struct{ from, to int64 }

// sourceGapReason explains source records deleted before they were
// mirrored, with the way on.
func sourceGapReason(k Key, from, logStart int64) string {
	return fmt.Sprintf("source offsets %d..%d of %s were deleted on the source before they were mirrored (retention, or records deleted "+
		"by an operator); the source log starts at %d. Nothing after them is lost. To mirror on from %d, counting the %d records as lost: "+
		"kmirror resume --mirror %s --topic %s --partition %d --accept-gap",
		from, logStart-1, k, logStart, logStart, logStart-from, k.Mirror, k.Topic, k.Partition)
}

// sourceTruncatedReason explains a source log that ends before what was
// mirrored from it.
func sourceTruncatedReason(k Key, offset, logEnd int64) string {
	return fmt.Sprintf("source offset %d of %s is beyond the source log's end (%d): the source lost records that were mirrored "+
		"(an unclean leader election, or the topic was deleted and recreated); the destination keeps them", offset, k, logEnd)
}

// duplicate is a batch kmirror itself wrote a second time: a resend or a
// late request the destination broker could not de-duplicate because it
// had dropped the producer's state (fetch/DESIGN.md).
type duplicate struct {
	first, last int64 // destination offsets
	producer    kafka.ProducerID
	seq         int32 // base sequence, one that was already acknowledged
}

func (d duplicate) records() int64 { return d.last - d.first + 1 }

func (d duplicate) String() string {
	return fmt.Sprintf("destination offsets %d..%d repeat an earlier batch of kmirror's own producer (ID %d, epoch %d, base sequence %d): "+
		"a resend or a late request landed twice because the destination broker had dropped the producer's state "+
		"(producer.id.expiration.ms counts from the records' timestamps); nothing was lost, mirroring continued after it",
		d.first, d.last, d.producer.ID, d.producer.Epoch, d.seq)
}

// ownSeqs maps each producer identity kmirror wrote a partition with to
// the next sequence number it would use there.
type ownSeqs map[kafka.ProducerID]int32

func (o ownSeqs) clone() ownSeqs {
	c := make(ownSeqs, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

// seqBehind reports whether a batch starting at sequence seq lies before
// next in the producer's sequence space (which wraps at 2^31, like
// Kafka's): its sequence range was used already.
func seqBehind(seq, next int32) bool {
	d := (int64(next) - int64(seq) + 1<<31) % (1 << 31)
	return d > 0 && d <= 1<<30
}

// walk reads the destination from start.Dst to the end of the leader's log
// and the source from start.Src, through the same filter the data path
// applies, and checks that they hold the same records in the same order.
// own holds kmirror's producer identities for the partition with the next
// sequence of each as of start; pid, the one it writes with now, is among
// them. The walk works on a copy.
//
// It reads up to the log end offset, not only the high watermark: a batch
// appended but not yet replicated (above the high watermark on a
// replicated partition) is either committed later or truncated away by a
// leader change, and the walk waits until one of them has happened (the
// leader's log end offset, asked with OffsetForLeaderEpoch, is then at or
// below the high watermark). Deciding earlier would let such a batch
// become visible after the walk as a duplicate of what is sent next.
//
// A destination batch of one of these identities whose sequence lies
// before that identity's next one is kmirror's own duplicate: stepped over
// and returned in duplicates. Any other record that does not match the
// source is a Divergence, and so is one that matches but was written under
// another producer identity (not kmirror's copy, however equal).
//
// Where the source has deleted records the walk still had to read
// (retention or DeleteRecords after kmirror copied them, before its
// checkpoint), realign finds where the destination's copies of the
// source's first surviving batch start, and the walk goes on from there.
// gapBelow says which gap of records deleted before they were mirrored
// realign may skip (resume --accept-gap): one ending at or below it (0:
// any; -1: none).
func (e *Engine) walk(ctx context.Context, srcCl *kafka.Cluster, k Key, start Entry, startEpoch int32, pid kafka.ProducerID, own ownSeqs, xl *Translation, gapBelow int64) (res walkResult, err error) {
	// A walk that reads nothing ends at start, whose epoch is the one of
	// the batch before it (-1 unknown): never 0 by default, which would
	// make a later source leader change look like a truncation.
	res = walkResult{end: start, epoch: startEpoch, own: own.clone()}
	defer func() { res.nextSeq = res.own[pid] }()
	defer func() {
		var oor *kafka.OutOfRange
		if errors.As(err, &oor) && oor.Cluster == srcCl.Name {
			// The source lost what the walk must read, other than at a
			// batch boundary (realign handles those).
			if oor.Offset < oor.LogStart {
				err = &Divergence{Key: k, Reason: sourceGapReason(k, oor.Offset, oor.LogStart), GapBelow: oor.LogStart}
			} else {
				err = &Divergence{Key: k, Reason: sourceTruncatedReason(k, oor.Offset, oor.LogEnd)}
			}
		}
	}()
	done, err := e.walkSlot(ctx)
	if err != nil {
		return res, err
	}
	defer done()
	fetchAt := start.Src
	for {
		err := e.walkSpan(ctx, srcCl, k, pid, xl, &res, fetchAt)
		var sd *sourceDeleted
		if !errors.As(err, &sd) {
			return res, err
		}
		// Each realign ends at or past the source's log start, which is
		// past where this span met it: the loop always moves on.
		if fetchAt, err = e.realign(ctx, srcCl, k, xl, &res, *sd, pid, gapBelow); err != nil {
			return res, err
		}
	}
}

// sourceDeleted stops a walk span at a batch boundary (at) where the source
// has deleted offsets at.Src..logStart-1 that the walk had still to read.
type sourceDeleted struct {
	at       Entry
	logStart int64
}

func (s *sourceDeleted) Error() string {
	return fmt.Sprintf("source offsets %d..%d were deleted (walk at destination offset %d)", s.at.Src, s.logStart-1, s.at.Dst)
}

// deletedAt turns a source read below the source's log start into a
// sourceDeleted at destination offset dst, or returns nil.
func deletedAt(err error, srcCl *kafka.Cluster, dst int64) *sourceDeleted {
	var oor *kafka.OutOfRange
	if errors.As(err, &oor) && oor.Cluster == srcCl.Name && oor.Offset < oor.LogStart {
		return &sourceDeleted{at: Entry{Src: oor.Offset, Dst: dst}, logStart: oor.LogStart}
	}
	return nil
}

// ownID returns b's producer identity and whether it is one of kmirror's
// for the partition.
func (w *walkResult) ownID(b kwire.Batch) (kafka.ProducerID, bool) {
	id := kafka.ProducerID{ID: b.ProducerID(), Epoch: b.ProducerEpoch()}
	_, ok := w.own[id]
	return id, ok && id.ID >= 0
}

// ownProducer reports whether b was written under a producer ID of
// kmirror's for the partition, at any epoch: the destination allocates
// producer IDs, so no application holds one of them, while an epoch bumped
// by a renewal since the checkpoint may be unknown to this walk.
func (w *walkResult) ownProducer(b kwire.Batch) bool {
	for id := range w.own {
		if id.ID >= 0 && id.ID == b.ProducerID() {
			return true
		}
	}
	return false
}

// writer names who wrote b (pid is the identity kmirror writes with now).
func (w *walkResult) writer(b kwire.Batch, pid kafka.ProducerID) string {
	if id, ok := w.ownID(b); ok {
		return fmt.Sprintf("written by kmirror's producer ID %d", id.ID)
	}
	if b.ProducerID() < 0 {
		return fmt.Sprintf("written by a producer that is not idempotent (no producer ID; kmirror's is %d)", pid.ID)
	}
	return fmt.Sprintf("written by producer ID %d, kmirror's is %d", b.ProducerID(), pid.ID)
}

// foreignAdvice is what to do about someone else's batch b ("" for one of
// kmirror's): it ends a reason, after what was found.
func (w *walkResult) foreignAdvice(b kwire.Batch) string {
	if _, ok := w.ownID(b); ok {
		return ""
	}
	return ". Another producer has written to the destination partition (mirror topics must stay read-only until failover). " +
		"To go on, stop that producer, then either kmirror remove the topic (failover: the destination is the copy to use) " +
		"or delete the destination topic, remove and add it again"
}

// walkSpan is one stretch of a walk: the destination from res.end.Dst and
// the source from res.end.Src (fetched at fetchAt, the source's log start
// when that is past res.end.Src, see sourceIter.from), up to the end of the
// destination leader's log or to a sourceDeleted.
func (e *Engine) walkSpan(ctx context.Context, srcCl *kafka.Cluster, k Key, pid kafka.ProducerID, xl *Translation, res *walkResult, fetchAt int64) error {
	dst, err := kafka.OpenPartitionReader(ctx, e.dest, k.Topic, k.Partition, res.end.Dst, false)
	if err != nil {
		return err
	}
	defer dst.Close()
	srcIt := &sourceIter{from: res.end.Src}
	if srcIt.r, err = kafka.OpenPartitionReader(ctx, srcCl, k.Topic, k.Partition, fetchAt, true); err != nil {
		return err
	}
	defer srcIt.r.Close()
	diverge := func(format string, args ...any) error {
		return &Divergence{Key: k, Reason: fmt.Sprintf(format, args...)}
	}
	for {
		batches, ended, err := dst.NextSettled(ctx)
		var oor *kafka.OutOfRange
		if errors.As(err, &oor) && oor.Offset < oor.LogStart {
			// Retention on the destination deleted records past the
			// checkpoint: kmirror's own, written before the crash (the
			// checkpoint lags the data by up to checkpoint_interval).
			// They cannot be read back, so the walk maps them to the
			// source records they were made of without comparing, and
			// verifies from the destination's log start on.
			if err := e.skipDeleted(ctx, k, srcCl, srcIt, xl, res, pid, oor.LogStart); err != nil {
				return err
			}
			dst.Offset = oor.LogStart
			continue
		}
		if oor != nil {
			return diverge("destination offset %d is beyond the destination log's end (%d): records kmirror wrote were lost "+
				"on the destination (an unclean leader election there, or the topic was deleted and recreated)", oor.Offset, oor.LogEnd)
		}
		if err != nil {
			return err
		}
		if ended {
			return nil
		}
		for _, b := range batches {
			if b.BaseOffset() < res.end.Dst {
				return diverge("destination batch %d..%d starts before the checkpointed offset %d", b.BaseOffset(), b.LastOffset(), res.end.Dst)
			}
			if id, ok := res.ownID(b); ok && seqBehind(b.BaseSequence(), res.own[id]) {
				res.duplicates = append(res.duplicates, duplicate{first: b.BaseOffset(), last: b.LastOffset(), producer: id, seq: b.BaseSequence()})
				res.end.Dst = b.LastOffset() + 1
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return fmt.Errorf("destination %s/%d: %w", k.Topic, k.Partition, err)
			}
			for i, r := range recs {
				sr, ok, err := srcIt.next(ctx)
				if err != nil {
					if sd := deletedAt(err, srcCl, res.end.Dst); sd != nil && i == 0 {
						return sd
					}
					return err
				}
				if !ok {
					return &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
						"destination offset %d (%s) holds a record beyond the source's committed data (source offset %d): "+
							"the destination was written by someone else or the source lost records%s",
						r.Offset, res.writer(b, pid), srcIt.r.Offset, res.foreignAdvice(b))}}
				}
				if why := recordDiff(sr, r); why != "" {
					return diverge("destination offset %d (%s) does not match source offset %d (%s): "+
						"the destination was written by someone else or the source log changed%s",
						r.Offset, res.writer(b, pid), sr.Offset, why, res.foreignAdvice(b))
				}
				if !res.ownProducer(b) {
					// Equal is not enough: an application's record that a
					// mirror in the other direction echoed back to the
					// source equals it too (issue 21: an echo loop
					// duplicated every record on both clusters).
					return diverge("destination offset %d (%s) equals source offset %d but kmirror did not write it: "+
						"a record is taken for kmirror's copy only under kmirror's producer identity. An application wrote it, "+
						"or a mirror in the other direction copied it to the source (a mirror loop)%s",
						r.Offset, res.writer(b, pid), sr.Offset, res.foreignAdvice(b))
				}
				if en, ok := xl.Observe(sr.Offset, r.Offset); ok {
					res.entries = append(res.entries, en)
				}
				res.walked++
			}
			if srcIt.pending() {
				return diverge("destination batch %d..%d ends inside source batch ending at offset %d", b.BaseOffset(), b.LastOffset(), srcIt.cur.srcNext-1)
			}
			res.end = Entry{Src: srcIt.cur.srcNext, Dst: b.LastOffset() + 1}
			res.epoch = srcIt.cur.epoch
			if id, ok := res.ownID(b); ok {
				// LastOffsetDelta, not the record count: compaction on the
				// destination may have removed records of the batch.
				res.own[id] = kwire.NextSequence(b.BaseSequence(), b.LastOffsetDelta()+1)
			}
		}
	}
}

// skipDeleted advances a walk over destination offsets res.end.Dst up to
// logStart, deleted by destination retention: as many source records as
// destination offsets were deleted (one destination record per mirrored
// source record), ending on a source batch boundary, since retention
// deletes whole segments and kmirror's batches match source batches. The
// producer sequence of pid moves on by the records skipped; if the broker
// still holds state for pid with another sequence, the next produce is
// refused as out of order and the identity is renewed (a verified walk
// again). Where the source has deleted those records too, it returns a
// sourceDeleted at the first one it could not read.
func (e *Engine) skipDeleted(ctx context.Context, k Key, srcCl *kafka.Cluster, srcIt *sourceIter, xl *Translation, res *walkResult, pid kafka.ProducerID, logStart int64) error {
	n := logStart - res.end.Dst
	for i := int64(0); i < n; i++ {
		sr, ok, err := srcIt.next(ctx)
		if sd := deletedAt(err, srcCl, res.end.Dst+i); sd != nil {
			res.own[pid] = kwire.NextSequence(res.own[pid], int32(i))
			res.walked += i
			return sd
		}
		if err != nil {
			return err
		}
		if !ok {
			return &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
				"destination retention deleted offsets %d..%d, more records than the source holds after source offset %d",
				res.end.Dst, logStart-1, srcIt.r.Offset)}}
		}
		if en, ok := xl.Observe(sr.Offset, res.end.Dst+i); ok {
			res.entries = append(res.entries, en)
		}
	}
	if srcIt.pending() {
		return &Divergence{Key: k, Reason: fmt.Sprintf("the destination log starts at %d, inside the batch of source records ending at %d: "+
			"not a batch kmirror wrote", logStart, srcIt.cur.srcNext-1)}
	}
	if n > 0 {
		res.end = Entry{Src: srcIt.cur.srcNext, Dst: logStart}
		res.epoch = srcIt.cur.epoch
		res.own[pid] = kwire.NextSequence(res.own[pid], int32(n))
		res.walked += n
	}
	e.log.Info("destination retention deleted records past the checkpoint; walking on from the destination's log start",
		zap.Stringer("partition", k), zap.Int64("deleted_from", logStart-n), zap.Int64("log_start", logStart))
	return nil
}

// recordDiff names the first difference between two records, or "".
func recordDiff(a, b kwire.Record) string {
	switch {
	case a.Timestamp != b.Timestamp:
		return fmt.Sprintf("timestamp %d != %d", a.Timestamp, b.Timestamp)
	case !sameBytes(a.Key, b.Key):
		return "key differs"
	case !sameBytes(a.Value, b.Value):
		return "value differs"
	case len(a.Headers) != len(b.Headers):
		return fmt.Sprintf("%d headers != %d", len(a.Headers), len(b.Headers))
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !sameBytes(a.Headers[i].Value, b.Headers[i].Value) {
			return fmt.Sprintf("header %d differs", i)
		}
	}
	return ""
}

// sameBytes compares byte slices keeping null and empty apart.
func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

// sourceIter yields the source records the data path would mirror, in
// order, through the same buildItems filter.
type sourceIter struct {
	r *kafka.PartitionReader
	// from, when below r.offset, is where the first fetch's records are
	// taken from: after the source deleted records up to its log start L,
	// a fetch at L still returns the whole batch holding L, and a walk
	// that realigned on that batch compares all of its records (-1: r.offset).
	from  int64
	items []*item
	cur   *item
	recs  []kwire.Record
}

func (s *sourceIter) pending() bool { return len(s.recs) > 0 }

func (s *sourceIter) next(ctx context.Context) (kwire.Record, bool, error) {
	for len(s.recs) == 0 {
		for len(s.items) > 0 && len(s.recs) == 0 {
			s.cur, s.items = s.items[0], s.items[1:]
			if s.cur.skip() {
				continue
			}
			recs, err := s.cur.records()
			if err != nil {
				return kwire.Record{}, false, err
			}
			s.recs = recs
		}
		if len(s.recs) > 0 {
			break
		}
		fp, err := s.r.Fetch(ctx)
		if err != nil {
			return kwire.Record{}, false, err
		}
		from := s.r.Offset
		if s.from >= 0 && s.from < from {
			from = s.from
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, from)
		if err != nil {
			return kwire.Record{}, false, err
		}
		if len(items) == 0 && need == 0 {
			return kwire.Record{}, false, nil // nothing more committed
		}
		if len(items) == 0 {
			s.r.MaxBytes = kafka.GrowFetch(s.r.MaxBytes, need)
			continue
		}
		s.items, s.r.Offset, s.from = items, next, -1
	}
	r := s.recs[0]
	s.recs = s.recs[1:]
	return r, true, nil
}

// maxWalks bounds the walks (resume, confirm, settle) an engine runs at
// once: a member taking over many partitions walks them a few at a time,
// on pooled connections, with their buffers charged to the memory budget.
const maxWalks = kafka.MaxIdlePerBroker

// walkBufferBytes is what one walk's two readers fetch at once at first.
const walkBufferBytes = 2 * kafka.ReaderFetchBytes

// walkSlot waits for one of maxWalks walk slots and charges the walk's
// buffers to the memory budget (at most an eighth of it, so a small budget
// still lets walks run); done gives both back.
func (e *Engine) walkSlot(ctx context.Context) (done func(), err error) {
	select {
	case e.walks <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	charge := min(int64(walkBufferBytes), e.cfg.MemoryBudget/maxWalks)
	e.mu.Lock()
	e.inUse += charge
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		e.inUse -= charge
		e.kickFetchersLocked()
		e.mu.Unlock()
		<-e.walks
	}, nil
}
