package fetch

import (
	"errors"
	"fmt"

	"go.uber.org/zap"
)

// confirmLocked stops sending p until confirm has established what the
// destination holds after p's last acknowledged batch. why says what made
// the outcome unknown; describe shows it while confirm runs.
//
// A resend never relies on the broker's de-duplication alone: the broker
// keeps a producer's state only while its last batch's newest record
// timestamp is younger than producer.id.expiration.ms, and mirrored
// batches keep the source's timestamps, so during the copy of an old
// backlog the state may be gone and a blind resend would be appended a
// second time (the package doc has the whole argument).
func (e *Engine) confirmLocked(p *partition, why string) {
	p.produceErr = why
	if p.send == sendConfirming {
		return
	}
	p.moveSend(sendConfirming)
	gen := p.gen
	e.goLoop(func() { e.confirm(p, gen, why) })
}

// confirm walks the destination from p's last acknowledged position to
// the end of the leader's log (waiting for records above the high
// watermark to be committed or truncated), against the source, and takes
// the batches it finds there as acknowledged. What is not there is sent
// again with the same sequence numbers. A walk that finds records that are
// not the source's stops the partition (DIVERGED); a failed walk is
// retried with backoff while the partition stays MIRRORING.
func (e *Engine) confirm(p *partition, gen int, why string) {
	backoff := e.cfg.RetryBackoff
	behind := 0 // walks that found destination records past the source's end
	for {
		e.mu.Lock()
		if p.gen != gen || !p.active() {
			e.mu.Unlock()
			return
		}
		k := p.key()
		start, startEpoch := Entry{Src: p.pos.SourceOffset, Dst: p.pos.DestinationOffset}, p.pos.SourceLeaderEpoch
		pid, own := p.producer, p.own.clone()
		own[pid] = p.nextSeq
		xl := p.xl.tail()
		src := e.sources[k.Mirror]
		e.mu.Unlock()
		var w walkResult
		err := fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
		if src != nil {
			w, err = e.walk(e.ctx, src.cl, k, start, startEpoch, pid, own, &xl, -1)
		}
		if e.ctx.Err() != nil {
			return
		}
		e.mu.Lock()
		if p.gen != gen {
			e.mu.Unlock()
			return
		}
		var dv *Divergence
		var sb *sourceBehind
		switch {
		case err == nil:
			e.applyConfirmLocked(p, w)
			e.mu.Unlock()
			return
		case errors.As(err, &dv):
			p.gapBelow = dv.GapBelow
			e.divergeLocked(p, dv.Reason) // describe names the partition
			e.mu.Unlock()
			return
		case errors.As(err, &sb):
			// A record past the source's end: a source leader's last
			// stable offset lags briefly after a leader change, so it is
			// retried as resume retries it; then it is someone else's
			// record (a foreign write into an idle partition).
			if behind++; behind > behindRetries {
				e.divergeLocked(p, sb.Reason)
				e.mu.Unlock()
				return
			}
		}
		p.produceErr = fmt.Sprintf("%s; verifying what landed: %v", why, err)
		e.mu.Unlock()
		e.log.Warn("verifying an unacknowledged batch failed; retrying", zap.Stringer("partition", k), zap.Error(err))
		sleepCtx(e.ctx, backoff)
		backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
	}
}

// applyConfirmLocked takes the queued items that a confirm walk found on
// the destination as acknowledged and lets the rest be sent.
func (e *Engine) applyConfirmLocked(p *partition, w walkResult) {
	for len(p.queue) > 0 && p.queue[0].srcNext <= w.end.Src {
		it := p.queue[0]
		p.queue = p.queue[1:]
		e.dequeueLocked(p, it)
	}
	if len(p.queue) > 0 && p.queue[0].srcFirst < w.end.Src {
		// The walk ended inside a queued item: the queue no longer lines up
		// with the destination. Start over from the checkpoint.
		e.failLocked(p, fmt.Errorf("verified destination position (source offset %d) falls inside a queued batch %d..%d",
			w.end.Src, p.queue[0].srcFirst, p.queue[0].srcNext-1))
		return
	}
	for _, en := range w.entries {
		p.xl.Observe(en.Src, en.Dst)
	}
	if w.end != (Entry{Src: p.pos.SourceOffset, Dst: p.pos.DestinationOffset}) {
		p.pos.SourceOffset, p.pos.DestinationOffset = w.end.Src, w.end.Dst
		if w.walked > 0 {
			p.pos.SourceLeaderEpoch = w.epoch
		}
		p.xl.Advance(w.end.Src, w.end.Dst)
		p.dirty = true
	}
	p.nextSeq, p.own = w.nextSeq, w.own
	p.acked = false // one batch at a time until the broker acknowledges one
	if h := p.headBatch(); h != nil && h.seqSet && h.seq != p.nextSeq {
		// collectProduce numbers them again, each after the one before.
		for _, it := range p.queue {
			it.seqSet = false
		}
	}
	e.noteDuplicatesLocked(p, w.duplicates)
	p.moveSend(sendIdle)
	p.produceErr = ""
	p.dstLeader = -1
	p.failures = 0
	e.log.Info("destination verified after the last acknowledged batch", zap.Stringer("partition", p.key()),
		zap.Int64("source_offset", w.end.Src), zap.Int64("destination_offset", w.end.Dst),
		zap.Int64("walked_records", w.walked), zap.Int("duplicate_batches", len(w.duplicates)))
	if p.releasing() && p.drained() && p.released != nil {
		closeOnce(p)
	}
	kick(e.kickRt)
}

// noteDuplicatesLocked makes kmirror's own duplicates found on the
// destination visible: an error log line each, the partition's count
// (describe, /metrics) and the latest one's description.
func (e *Engine) noteDuplicatesLocked(p *partition, dups []duplicate) {
	for _, d := range dups {
		p.duplicateRecords += d.records()
		p.lastDuplicate = d.String()
		e.logDuplicate(p.key(), d)
	}
}

// logDuplicate reports one of kmirror's own duplicates at error level.
func (e *Engine) logDuplicate(k Key, d duplicate) {
	e.log.Error("kmirror's own batch is on the destination twice", zap.Stringer("partition", k),
		zap.Int64("first_offset", d.first), zap.Int64("last_offset", d.last), zap.String("reason", d.String()))
}
