package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// Divergence means the source and destination disagree: the partition
// stops (DIVERGED) and needs an operator. It is never retried silently.
type Divergence struct {
	Key    Key
	Reason string
	// GapBelow is set when source records were deleted before they were
	// mirrored: the source's log start (see Control.Report).
	GapBelow int64
}

func (d *Divergence) Error() string { return fmt.Sprintf("%s diverged: %s", d.Key, d.Reason) }

// sourceBehind means the destination holds records past what the source
// serves now. Right after a source leader change the new leader's last
// stable offset can briefly lag, so this is retried a few times
// (behindRetries) before it counts as a divergence.
type sourceBehind struct{ Divergence }

const behindRetries = 5

// resume takes over a partition exactly (design.md section 4): adopt the
// producer identity, read the last checkpoint, walk source and destination
// from it up to the destination's high watermark verifying every record,
// and start mirroring after the last verified batch with the next sequence.
func (e *Engine) resume(ctx context.Context, p *partition, gen int) error {
	e.mu.Lock()
	spec := p.spec
	src := e.sources[spec.Key.Mirror]
	e.mu.Unlock()
	k := spec.Key
	if src == nil {
		return fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
	}
	if err := e.waitIdle(ctx, p, gen); err != nil {
		return err
	}
	if err := e.checkTopics(ctx, src.cl, spec); err != nil {
		return err
	}
	if err := e.store.catchUp(ctx); err != nil {
		return fmt.Errorf("read checkpoints: %w", err)
	}
	cp, hasCP, xl, err := e.store.load(k, Entry{Src: spec.StartOffset})
	if err != nil {
		return err
	}
	if h := spec.Handoff; h != nil {
		if hasCP && cp.Src == h.Position.SourceOffset && cp.Dst == h.Position.DestinationOffset && cp.PID == h.Producer.ID && cp.Epoch == h.Producer.Epoch {
			return e.startHandoff(p, gen, *h, xl)
		}
		e.log.Warn("handoff position is not the last checkpoint; resuming with a walk", zap.Stringer("partition", k),
			zap.Int64("handoff_source_offset", h.Position.SourceOffset), zap.Int64("checkpoint_source_offset", cp.Src))
	}
	var pid ProducerID
	if spec.Producer != nil {
		pid = *spec.Producer
	} else {
		var err error
		if pid, err = e.destAdmin.InitProducerID(ctx); err != nil {
			return err
		}
		if err := e.ctl.SaveProducer(ctx, k, spec.Generation, pid); err != nil {
			return fmt.Errorf("save producer identity of %s: %w", k, err)
		}
		// Allocated once: a failed walk below must not allocate again.
		e.mu.Lock()
		if p.gen == gen {
			p.spec.Producer = &pid
		}
		e.mu.Unlock()
	}
	start, startEpoch := Entry{Src: spec.StartOffset}, int32(-1)
	// Every identity the partition wrote with since the checkpoint is
	// kmirror's own: a late copy carrying one of them is a duplicate, not
	// a foreign write (an identity renewed after OUT_OF_ORDER_SEQUENCE).
	own := ownSeqs{pid: 0}
	if hasCP {
		start, startEpoch = Entry{Src: cp.Src, Dst: cp.Dst}, cp.LeaderEpoch
		if cp.PID >= 0 {
			own[ProducerID{ID: cp.PID, Epoch: cp.Epoch}] = cp.Seq
		}
	}
	e.mu.Lock()
	for id, next := range p.own {
		if _, ok := own[id]; !ok {
			own[id] = next
		}
	}
	e.mu.Unlock()
	gapBelow := int64(-1) // no gap may be skipped
	if spec.AcceptGap {
		gapBelow = spec.AcceptGapBelow
	}
	w, err := e.walk(ctx, src.cl, k, start, startEpoch, pid, own, &xl, gapBelow)
	if err != nil {
		return err
	}
	if spec.AcceptGap {
		err := e.acceptGap(ctx, src.cl, spec, &w)
		// Used up either way: a later restart of this lease must not skip
		// a gap the operator never saw (a failed record means DIVERGED
		// again, and the operator runs resume again).
		e.mu.Lock()
		if p.gen == gen {
			p.spec.AcceptGap = false
		}
		e.mu.Unlock()
		if err != nil {
			return err
		}
	}
	seq := w.nextSeq
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.staleStartLocked(p, gen) {
		return nil
	}
	e.noteDuplicatesLocked(p, w.duplicates)
	e.mirrorFromLocked(p, pid, seq, w.own, Position{SourceOffset: w.end.Src, DestinationOffset: w.end.Dst, SourceLeaderEpoch: w.epoch}, xl)
	e.log.Info("partition resumed", zap.Stringer("partition", k), zap.Int64("source_offset", w.end.Src),
		zap.Int64("destination_offset", w.end.Dst), zap.Int64("walked_records", w.walked),
		zap.Int64("producer_id", pid.ID), zap.Int32("sequence", seq))
	return nil
}

// acceptGap applies the operator's kmirror resume --accept-gap to a walk
// that ended at w.end: source records deleted before they were mirrored
// (found by the walk, or below the source's log start now) are skipped, and
// the skipped range is recorded through the control plane before anything
// is mirrored past it. The permission is used up even when there is no
// gap, so it never covers a later one.
func (e *Engine) acceptGap(ctx context.Context, srcCl *cluster, spec Spec, w *walkResult) error {
	k := spec.Key
	gap := gapRange{from: w.end.Src, to: w.end.Src}
	if w.gap != nil {
		gap = *w.gap
	} else {
		start, err := srcCl.listOffset(ctx, k.Topic, k.Partition, Earliest)
		if err != nil {
			return err
		}
		if start > w.end.Src {
			gap.to = start
			w.end.Src = start
		}
	}
	if gap.to > gap.from && spec.AcceptGapBelow > 0 && gap.to > spec.AcceptGapBelow {
		// More was deleted since the operator accepted the gap: that is
		// not what they accepted. The permission is used up; DIVERGED.
		if err := e.ctl.RecordGap(ctx, k, spec.Generation, gap.from, gap.from); err != nil {
			return fmt.Errorf("use up the gap permission of %s: %w", k, err)
		}
		return &Divergence{Key: k, GapBelow: gap.to, Reason: sourceGapReason(k, gap.from, gap.to) +
			fmt.Sprintf(" (the gap accepted earlier ended at source offset %d: more was deleted since, so this one is not skipped)", spec.AcceptGapBelow-1)}
	}
	if err := e.ctl.RecordGap(ctx, k, spec.Generation, gap.from, gap.to); err != nil {
		return fmt.Errorf("record the accepted gap %d..%d of %s: %w", gap.from, gap.to-1, k, err)
	}
	if gap.to > gap.from {
		e.log.Warn("source records deleted before they were mirrored were skipped, as the operator accepted",
			zap.Stringer("partition", k), zap.Int64("from", gap.from), zap.Int64("to", gap.to-1), zap.Int64("records", gap.to-gap.from))
	}
	return nil
}

// checkTopics checks, before a partition starts, that its source and
// destination topics exist and are the ones the mirror recorded (topic
// IDs): a recreated topic is a Divergence, a missing one an error (FAILED,
// retried).
func (e *Engine) checkTopics(ctx context.Context, srcCl *cluster, spec Spec) error {
	k := spec.Key
	for _, side := range []struct {
		cl   *cluster
		want string
		name string
	}{{srcCl, spec.SourceTopicID, "source"}, {e.dest, spec.DestTopicID, "destination"}} {
		side.cl.watch(k.Topic)
		md, err := side.cl.metadata(ctx, 0)
		if err != nil {
			return err
		}
		if code, ok := md.TopicErrors[k.Topic]; ok && code == kwire.CodeUnknownTopicOrPartition {
			return fmt.Errorf("%s", topicGoneReason(k, side.name, side.cl.name))
		}
		if id := md.TopicIDs[k.Topic]; side.want != "" && id != "" && id != side.want {
			return &Divergence{Key: k, Reason: topicRecreatedReason(k, side.name, id, side.want)}
		}
		if parts, ok := md.Topics[k.Topic]; ok && int(k.Partition) >= len(parts) {
			return fmt.Errorf("%s topic %s has %d partitions, not partition %d yet", side.name, k.Topic, len(parts), k.Partition)
		}
	}
	return nil
}

// topicGoneReason says a mirrored topic is missing on one side.
func topicGoneReason(k Key, side, cluster string) string {
	what := "recreate it on the source (kmirror then stops the partitions DIVERGED: a new topic's offsets mean other records) " +
		"or stop mirroring it: kmirror remove --mirror " + k.Mirror + " --topic " + k.Topic
	if side == "destination" {
		what = "kmirror does not recreate it by itself (consumers may have moved to it); stop mirroring it: kmirror remove --mirror " +
			k.Mirror + " --topic " + k.Topic + ", then add it again to start over"
	}
	return fmt.Sprintf("%s topic %s no longer exists on the %s (%s): %s", side, k.Topic, cluster, k, what)
}

// topicRecreatedReason says a mirrored topic was deleted and created again.
func topicRecreatedReason(k Key, side, now, was string) string {
	return fmt.Sprintf("%s topic %s was recreated (topic ID now %s, mirrored %s): its records are not the ones mirrored. "+
		"To start over: kmirror remove --mirror %s --topic %s, delete topic %s on the destination cluster, then kmirror add it again",
		side, k.Topic, now, was, k.Mirror, k.Topic, k.Topic)
}

// staleStartLocked reports whether the start of p that began in gen was
// overtaken (a restart, or a release that is now waiting for it).
func (e *Engine) staleStartLocked(p *partition, gen int) bool {
	if p.gen == gen && !p.draining {
		return false
	}
	if p.draining && p.released != nil {
		closeOnce(p)
	}
	return true
}

// mirrorFromLocked sets p mirroring from pos with producer identity pid at
// sequence seq (own: every identity of the partition with its next
// sequence) and the translation xl (with what it has not saved yet).
func (e *Engine) mirrorFromLocked(p *partition, pid ProducerID, seq int32, own ownSeqs, pos Position, xl Translation) {
	p.producer, p.spec.Producer, p.resumed = pid, &pid, true
	p.nextSeq, p.own = seq, own
	p.confirming = false
	p.pos = pos
	p.xl = xl
	p.xl.Advance(pos.SourceOffset, pos.DestinationOffset)
	p.dirty = true
	p.fetchOffset = pos.SourceOffset
	p.fetchedEpoch = pos.SourceLeaderEpoch
	p.fetchBytes = e.cfg.PartitionBytes
	p.srcLeader, p.dstLeader = -1, -1
	p.outOfRange, p.gapBelow = false, 0
	// failures is reset by the first acknowledged batch, not here: a
	// partition that fails again right after resuming backs off longer.
	e.setStateLocked(p, Mirroring, "")
	kick(e.kickRt)
}

// startHandoff continues a partition exactly where its previous owner
// drained it (design.md section 3, graceful handoff): same producer
// identity, next sequence, position and translation, no walk. The previous
// owner acknowledged every batch it sent and wrote this checkpoint before
// it released the partition through raft, so nothing of its can land later.
func (e *Engine) startHandoff(p *partition, gen int, h Handoff, xl Translation) error {
	start := Entry{Src: h.Position.SourceOffset, Dst: h.Position.DestinationOffset}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.staleStartLocked(p, gen) {
		return nil
	}
	pid := h.Producer
	e.mirrorFromLocked(p, pid, h.Sequence, ownSeqs{pid: h.Sequence}, h.Position, xl)
	e.log.Info("partition taken over by handoff", zap.Stringer("partition", p.key()), zap.Int64("source_offset", start.Src),
		zap.Int64("destination_offset", start.Dst), zap.Int64("producer_id", pid.ID), zap.Int32("sequence", h.Sequence))
	return nil
}

// waitIdle waits until no produce of p's is in flight, so the walk sees
// every batch an earlier run of the partition may still land. It gives up
// waiting when p is restarted past gen (any gen < 0 never is).
func (e *Engine) waitIdle(ctx context.Context, p *partition, gen int) error {
	for {
		e.mu.Lock()
		idle := !p.inflight || (gen >= 0 && p.gen != gen)
		e.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

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
	producer    ProducerID
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
type ownSeqs map[ProducerID]int32

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

// uncommittedPoll is how often a walk re-reads a destination partition
// whose leader holds records above the high watermark.
const uncommittedPoll = 100 * time.Millisecond

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
// source is a Divergence.
func (e *Engine) walk(ctx context.Context, srcCl *cluster, k Key, start Entry, startEpoch int32, pid ProducerID, own ownSeqs, xl *Translation, gapBelow int64) (res walkResult, err error) {
	// A walk that reads nothing ends at start, whose epoch is the one of
	// the batch before it (-1 unknown): never 0 by default, which would
	// make a later source leader change look like a truncation.
	res = walkResult{end: start, epoch: startEpoch, own: own.clone()}
	defer func() { res.nextSeq = res.own[pid] }()
	defer func() {
		var oor *outOfRange
		if errors.As(err, &oor) && oor.cluster == srcCl.name {
			// The source lost what the walk must read.
			if oor.offset < oor.logStart {
				err = &Divergence{Key: k, Reason: sourceGapReason(k, oor.offset, oor.logStart), GapBelow: oor.logStart}
			} else {
				err = &Divergence{Key: k, Reason: sourceTruncatedReason(k, oor.offset, oor.logEnd)}
			}
		}
	}()
	done, err := e.walkSlot(ctx)
	if err != nil {
		return res, err
	}
	defer done()
	dst, err := openPartitionReader(ctx, e.dest, k.Topic, k.Partition, start.Dst, false)
	if err != nil {
		return res, err
	}
	defer dst.close()
	srcIt := &sourceIter{gapBelow: gapBelow}
	if srcIt.r, err = openPartitionReader(ctx, srcCl, k.Topic, k.Partition, start.Src, true); err != nil {
		return res, err
	}
	defer srcIt.r.close()
	defer func() { res.gap = srcIt.gap }()
	diverge := func(format string, args ...any) error {
		return &Divergence{Key: k, Reason: fmt.Sprintf(format, args...)}
	}
	ownID := func(b kwire.Batch) (ProducerID, bool) {
		id := ProducerID{ID: b.ProducerID(), Epoch: b.ProducerEpoch()}
		_, ok := res.own[id]
		return id, ok && id.ID >= 0
	}
	// writer names who wrote b; advice, for someone else's batch, what
	// to do (it ends the reason, after what was found).
	writer := func(b kwire.Batch) string {
		if id, ok := ownID(b); ok {
			return fmt.Sprintf("written by kmirror's producer ID %d", id.ID)
		}
		if b.ProducerID() < 0 {
			return fmt.Sprintf("written by a producer that is not idempotent (no producer ID; kmirror's is %d)", pid.ID)
		}
		return fmt.Sprintf("written by producer ID %d, kmirror's is %d", b.ProducerID(), pid.ID)
	}
	advice := func(b kwire.Batch) string {
		if _, ok := ownID(b); ok {
			return ""
		}
		return ". Another producer has written to the destination partition (mirror topics must stay read-only until failover). " +
			"To go on, stop that producer, then either kmirror remove the topic (failover: the destination is the copy to use) " +
			"or delete the destination topic, remove and add it again"
	}
	for {
		batches, hw, err := dst.next(ctx)
		var oor *outOfRange
		if errors.As(err, &oor) && oor.offset < oor.logStart {
			// Retention on the destination deleted records past the
			// checkpoint: kmirror's own, written before the crash (the
			// checkpoint lags the data by up to checkpoint_interval).
			// They cannot be read back, so the walk maps them to the
			// source records they were made of without comparing, and
			// verifies from the destination's log start on.
			if err := e.skipDeleted(ctx, k, srcIt, xl, &res, pid, oor.logStart); err != nil {
				return res, err
			}
			dst.offset = oor.logStart
			continue
		}
		if oor != nil {
			return res, diverge("destination offset %d is beyond the destination log's end (%d): records kmirror wrote were lost "+
				"on the destination (an unclean leader election there, or the topic was deleted and recreated)", oor.offset, oor.logEnd)
		}
		if err != nil {
			return res, err
		}
		if len(batches) == 0 {
			if res.end.Dst < hw {
				return res, fmt.Errorf("destination %s/%d: no data readable at offset %d below high watermark %d", k.Topic, k.Partition, res.end.Dst, hw)
			}
			leo, err := dst.logEndOffset(ctx)
			if err != nil {
				return res, err
			}
			if leo <= hw {
				return res, nil
			}
			// Records above the high watermark: wait until they are
			// committed (or a leader change truncates them).
			sleepCtx(ctx, uncommittedPoll)
			if err := ctx.Err(); err != nil {
				return res, err
			}
			continue
		}
		for _, b := range batches {
			if b.BaseOffset() < res.end.Dst {
				return res, diverge("destination batch %d..%d starts before the checkpointed offset %d", b.BaseOffset(), b.LastOffset(), res.end.Dst)
			}
			if id, ok := ownID(b); ok && seqBehind(b.BaseSequence(), res.own[id]) {
				res.duplicates = append(res.duplicates, duplicate{first: b.BaseOffset(), last: b.LastOffset(), producer: id, seq: b.BaseSequence()})
				res.end.Dst = b.LastOffset() + 1
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return res, fmt.Errorf("destination %s/%d: %w", k.Topic, k.Partition, err)
			}
			for _, r := range recs {
				sr, ok, err := srcIt.next(ctx)
				if err != nil {
					return res, err
				}
				if !ok {
					return res, &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
						"destination offset %d (%s) holds a record beyond the source's committed data (source offset %d): "+
							"the destination was written by someone else or the source lost records%s", r.Offset, writer(b), srcIt.r.offset, advice(b))}}
				}
				if why := recordDiff(sr, r); why != "" {
					return res, diverge("destination offset %d (%s) does not match source offset %d (%s): "+
						"the destination was written by someone else or the source log changed%s", r.Offset, writer(b), sr.Offset, why, advice(b))
				}
				if en, ok := xl.Observe(sr.Offset, r.Offset); ok {
					res.entries = append(res.entries, en)
				}
				res.walked++
			}
			if srcIt.pending() {
				return res, diverge("destination batch %d..%d ends inside source batch ending at offset %d", b.BaseOffset(), b.LastOffset(), srcIt.cur.srcNext-1)
			}
			res.end = Entry{Src: srcIt.cur.srcNext, Dst: b.LastOffset() + 1}
			res.epoch = srcIt.cur.epoch
			if id, ok := ownID(b); ok {
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
// again).
func (e *Engine) skipDeleted(ctx context.Context, k Key, srcIt *sourceIter, xl *Translation, res *walkResult, pid ProducerID, logStart int64) error {
	n := logStart - res.end.Dst
	for i := int64(0); i < n; i++ {
		sr, ok, err := srcIt.next(ctx)
		if err != nil {
			return err
		}
		if !ok {
			return &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
				"destination retention deleted offsets %d..%d, more records than the source holds after source offset %d",
				res.end.Dst, logStart-1, srcIt.r.offset)}}
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
	r *partitionReader
	// gapBelow lets the iterator skip one range of source offsets deleted
	// before they were mirrored, ending at or below gapBelow (0: any; -1:
	// none); gap says which it skipped.
	gapBelow int64
	gap      *gapRange
	items    []*item
	cur      *item
	recs     []kwire.Record
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
		fp, err := s.r.fetch(ctx)
		var oor *outOfRange
		if errors.As(err, &oor) && s.gapBelow >= 0 && s.gap == nil && oor.logStart > oor.offset &&
			(s.gapBelow == 0 || oor.logStart <= s.gapBelow) {
			// Deleted on the source before they were mirrored, and the
			// operator accepted that: go on at the log start.
			s.gap = &gapRange{from: oor.offset, to: oor.logStart}
			s.r.offset = oor.logStart
			continue
		}
		if err != nil {
			return kwire.Record{}, false, err
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, s.r.offset)
		if err != nil {
			return kwire.Record{}, false, err
		}
		if len(items) == 0 && need == 0 {
			return kwire.Record{}, false, nil // nothing more committed
		}
		if len(items) == 0 {
			s.r.maxBytes = growFetch(s.r.maxBytes, need)
		}
		s.items, s.r.offset = items, next
	}
	r := s.recs[0]
	s.recs = s.recs[1:]
	return r, true, nil
}

// maxWalks bounds the walks (resume, confirm, settle) an engine runs at
// once: a member taking over many partitions walks them a few at a time,
// on pooled connections, with their buffers charged to the memory budget.
const maxWalks = 8

// walkBufferBytes is what one walk's two readers fetch at once at first.
const walkBufferBytes = 2 * readerFetchBytes

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
