package fetch

import (
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// A partition's life in the engine: start (resume or handoff), FAILED with
// backoff and restart, DIVERGED, handed back for a producer renewal, and
// the state changes reported to the control plane in order.

// startLocked launches the resume of p after delay. Called with e.mu held.
func (e *Engine) startLocked(p *partition, delay time.Duration) {
	p.gen++
	gen := p.gen
	e.goLoop(func() { e.runStart(p, gen, delay) })
}

func (e *Engine) runStart(p *partition, gen int, delay time.Duration) {
	if delay > 0 {
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	err := e.resume(e.ctx, p, gen)
	if err == nil || e.ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.gen != gen {
		return
	}
	var dv *Divergence
	var behind *sourceBehind
	if errors.As(err, &dv) || (errors.As(err, &behind) && p.failures >= behindRetries) {
		// The reason as the fetch loop words it: the partition is named
		// by describe already.
		reason := err.Error()
		if dv != nil {
			p.gapBelow, reason = dv.GapBelow, dv.Reason
		} else if behind != nil {
			reason = behind.Reason
		}
		e.divergeLocked(p, reason)
		return
	}
	var kerr *kwire.Error
	if p.quietStarts == 0 {
		p.quietSince = time.Now()
	}
	if errors.As(err, &kerr) && kwire.Classify(kerr.Code) == kwire.RefreshMetadata && time.Since(p.quietSince) < quietStartWindow {
		// A leader that just moved, or a destination topic just created
		// whose leaders are not in every broker's own state yet (seen:
		// NOT_LEADER_OR_FOLLOWER from the leader the metadata named, for
		// 3,000 of 10,000 new partitions): not yet a failure to report.
		// Started again soon, from fresh metadata, still STARTING.
		p.quietStarts++
		e.log.Debug("partition start met a leadership change; starting again", zap.Stringer("partition", p.key()), zap.Error(err))
		e.startLocked(p, min(e.cfg.RetryBackoff<<min(p.quietStarts, 10), time.Second))
		return
	}
	e.failLocked(p, err)
}

// quietStartWindow is how long a partition's starts retry without
// reporting FAILED while a broker answers that its leadership moved
// (kwire.RefreshMetadata errors), from the first such answer; the next
// one fails it. A broker took over 0.3 s to take the leadership of 1,000
// partitions just created (make bench's idle step).
const quietStartWindow = 10 * time.Second

// failLocked puts p in FAILED and schedules a restart with backoff.
func (e *Engine) failLocked(p *partition, err error) {
	p.failures++
	backoff := e.cfg.RetryBackoff << min(p.failures, 10)
	if backoff > e.cfg.MaxRetryBackoff {
		backoff = e.cfg.MaxRetryBackoff
	}
	e.setLifeLocked(p, lifeFailed, err.Error())
	e.dropQueueLocked(p)
	if p.releasing() {
		// Being released: Release settles its position; no restart.
		e.log.Warn("partition failed while draining", zap.Stringer("partition", p.key()), zap.Error(err))
		return
	}
	e.log.Warn("partition failed; retrying", zap.Stringer("partition", p.key()),
		zap.Duration("backoff", backoff), zap.Error(err))
	e.startLocked(p, backoff)
}

func sameProducer(a, b *kafka.ProducerID) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// handBackLocked stops p after the destination refused its producer
// identity and asks the control plane to renew it; Assign restarts p once
// the new generation arrives.
func (e *Engine) handBackLocked(p *partition, reason string) {
	e.setLifeLocked(p, lifeRenewing, reason+"; waiting for the raft leader to renew the producer epoch")
	e.dropQueueLocked(p)
	p.gen++ // no restart before the renewal
	k, gen := p.key(), p.spec.Generation
	go e.ctl.RenewProducer(k, gen, reason)
}

// divergeLocked stops p for good: it needs an operator.
func (e *Engine) divergeLocked(p *partition, reason string) {
	e.divergences++
	e.setLifeLocked(p, lifeDiverged, reason)
	e.dropQueueLocked(p)
	p.gen++
	e.log.Error("partition diverged", zap.Stringer("partition", p.key()), zap.String("reason", reason))
}

// Diverge stops a MIRRORING partition held here as DIVERGED with reason
// (the background verifier found its destination differing from the
// source: daemon/verifier.go); false when the partition is not held or
// not mirroring.
func (e *Engine) Diverge(k Key, reason string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.mirroring() {
		return false
	}
	e.divergeLocked(p, reason)
	return true
}

func (e *Engine) dropQueueLocked(p *partition) {
	for _, it := range p.queue {
		e.dequeueLocked(p, it)
	}
	p.queue = nil
	// The restart walks the destination: a void window needs no confirm
	// of its own once its answers are in.
	p.voided, p.voidRenew, p.voidSpan = "", false, 0
	p.acked = false
	if p.send == sendConfirming {
		p.moveSend(sendIdle) // the restart walks; an in-flight produce is waited for
	}
	if p.releasing() && p.released != nil && p.send != sendInflight {
		closeOnce(p)
	}
}

// setLifeLocked moves p's life to l with reason, and reports the State it
// shows when that or the reason changed.
func (e *Engine) setLifeLocked(p *partition, l life, reason string) {
	before, beforeReason := p.reported(), p.reason
	p.moveLife(l)
	p.reason = reason
	s := p.reported()
	if s == before && reason == beforeReason {
		return
	}
	e.queueReportLocked(p)
}

// queueReportLocked queues the State p shows, under p's generation, for
// the control plane. Assign calls it when the generation moves under a
// held partition: the control plane refuses a report under an older
// generation (issue 19), so a change reported just before the move would
// otherwise never be told (a FAILED left shown for a partition that
// mirrors). The control plane drops a report that tells nothing new.
func (e *Engine) queueReportLocked(p *partition) {
	s := p.reported()
	gapBelow := int64(0)
	if s == Diverged {
		gapBelow = p.gapBelow
	}
	e.reports = append(e.reports, report{p.key(), p.spec.Generation, s, p.reason, gapBelow})
	kick(e.kickRep)
}

// report is a state change waiting to be told to the control plane.
type report struct {
	key      Key
	gen      uint64
	state    State
	reason   string
	gapBelow int64
}

// reportLoop tells the control plane about state changes one at a time,
// in the order they happened, outside the engine lock.
func (e *Engine) reportLoop() {
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-e.kickRep:
		}
		for {
			e.mu.Lock()
			if len(e.reports) == 0 {
				e.mu.Unlock()
				break
			}
			r := e.reports[0]
			e.reports = e.reports[1:]
			e.mu.Unlock()
			e.ctl.Report(r.key, r.gen, r.state, r.reason, r.gapBelow)
		}
	}
}
