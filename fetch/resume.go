package fetch

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
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
	cp, hasCP, xl, err := e.store.load(ctx, k, Entry{Src: spec.StartOffset})
	if err != nil {
		return err
	}
	xl.SetLimit(e.cfg.TranslationMaxBytes)
	if h := spec.Handoff; h != nil {
		if hasCP && cp.Src == h.Position.SourceOffset && cp.Dst == h.Position.DestinationOffset && cp.PID == h.Producer.ID && cp.Epoch == h.Producer.Epoch {
			return e.startHandoff(p, gen, *h, xl)
		}
		e.log.Warn("handoff position is not the last checkpoint; resuming with a walk", zap.Stringer("partition", k),
			zap.Int64("handoff_source_offset", h.Position.SourceOffset), zap.Int64("checkpoint_source_offset", cp.Src))
	}
	var pid kafka.ProducerID
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
			own[kafka.ProducerID{ID: cp.PID, Epoch: cp.Epoch}] = cp.Seq
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
		// Taken before it is used, and used up either way: a later
		// restart of this lease must not skip a gap the operator never
		// saw (a failed record means DIVERGED again, and the operator runs
		// resume again), and of two starts of the lease that overlap
		// (a restart while a stale one still walks) only the current one
		// records the gap.
		e.mu.Lock()
		stale, taken := p.gen != gen, !p.spec.AcceptGap
		if !stale && !taken {
			p.spec.AcceptGap = false
		}
		e.mu.Unlock()
		switch {
		case stale:
			return nil // a newer start of the partition runs
		case taken:
			return fmt.Errorf("the accepted gap of %s was used by an earlier start; starting again without it", k)
		}
		if err := e.acceptGap(ctx, src.cl, spec, &w); err != nil {
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
	if w.realigned || w.gap != nil {
		// Not at the next checkpoint_interval: a crash before it would
		// walk over the deleted records again (and meet an accepted gap
		// a second time, its permission used up).
		e.goLoop(e.checkpoint)
	}
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
func (e *Engine) acceptGap(ctx context.Context, srcCl *kafka.Cluster, spec Spec, w *walkResult) error {
	k := spec.Key
	gap := gapRange{from: w.end.Src, to: w.end.Src}
	if w.gap != nil {
		gap = *w.gap
	} else {
		start, err := srcCl.ListOffset(ctx, k.Topic, k.Partition, kafka.Earliest)
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
func (e *Engine) checkTopics(ctx context.Context, srcCl *kafka.Cluster, spec Spec) error {
	k := spec.Key
	for _, side := range []struct {
		cl   *kafka.Cluster
		want string
		name string
	}{{srcCl, spec.SourceTopicID, "source"}, {e.dest, spec.DestTopicID, "destination"}} {
		side.cl.Watch(k.Topic)
		md, err := side.cl.Metadata(ctx, 0)
		if err != nil {
			return err
		}
		if code, ok := md.TopicErrors[k.Topic]; ok && code == kwire.CodeUnknownTopicOrPartition {
			return fmt.Errorf("%s", topicGoneReason(k, side.name, side.cl.Name))
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
	if p.gen == gen && !p.releasing() {
		return false
	}
	if p.releasing() && p.released != nil {
		closeOnce(p)
	}
	return true
}

// mirrorFromLocked sets p mirroring from pos with producer identity pid at
// sequence seq (own: every identity of the partition with its next
// sequence) and the translation xl (with what it has not saved yet).
func (e *Engine) mirrorFromLocked(p *partition, pid kafka.ProducerID, seq int32, own ownSeqs, pos Position, xl Translation) {
	p.producer, p.spec.Producer, p.resumed = pid, &pid, true
	p.nextSeq, p.own = seq, own
	p.acked = false // one batch at a time until the broker acknowledges one
	if p.send == sendConfirming {
		p.moveSend(sendIdle)
	}
	p.pos = pos
	p.xl = xl
	p.xl.Advance(pos.SourceOffset, pos.DestinationOffset)
	p.dirty = true
	p.fetchOffset = pos.SourceOffset
	p.fetchedEpoch = pos.SourceLeaderEpoch
	p.fetchBytes = e.cfg.PartitionBytes
	p.srcLeader, p.dstLeader = -1, -1
	p.moveFetch(fetchOpen)
	p.gapBelow = 0
	// failures is reset by the first acknowledged batch, not here: a
	// partition that fails again right after resuming backs off longer.
	p.quietStarts = 0
	e.setLifeLocked(p, lifeMirroring, "")
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
		idle := p.send != sendInflight || (gen >= 0 && p.gen != gen)
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
