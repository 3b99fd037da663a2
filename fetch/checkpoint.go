package fetch

import (
	"context"
	"errors"
	"math"
	"time"

	"go.uber.org/zap"
)

// Checkpoints: writing each running partition's position to the progress
// store (offsets.go) every checkpoint_interval.

// checkpoint persists progress and new translation breakpoints of every
// partition that moved (run every cfg.Checkpoint).
func (e *Engine) checkpoint() {
	e.ckptMu.Lock()
	e.mu.Lock()
	var ups []update
	for _, p := range e.parts {
		if p.dirty && p.active() {
			ups = append(ups, e.updateLocked(p))
		}
	}
	e.mu.Unlock()
	if len(ups) == 0 {
		e.ckptMu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	err := e.store.write(ctx, ups)
	cancel()
	e.ckptMu.Unlock()
	var werr *WriteError
	if err != nil && !errors.As(err, &werr) {
		werr = &WriteError{Failed: map[Key]bool{}, Err: err}
		for _, u := range ups {
			werr.Failed[u.key] = true
		}
	}
	if werr != nil {
		e.log.Warn("checkpoint write failed; will retry", zap.Int("partitions", len(werr.Failed)), zap.Error(werr.Err))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, u := range ups {
		p, ok := e.parts[u.key]
		if !ok {
			continue
		}
		if werr != nil && werr.Failed[u.key] {
			// Only this partition waits for the next round; the others'
			// checkpoints are written.
			p.xl.requeue(u.segs, u.dropped)
			p.dirty = true
			p.checkpointErr = "checkpoint not written (retrying every checkpoint_interval): " + werr.Err.Error()
		} else {
			p.checkpointErr = ""
		}
	}
}

// restampCheck is how often the engine reads what was appended to the
// offsets topic since, to find records of a stale generation that are the
// latest of their key (restampStale): well within the topic's
// min.compaction.lag.ms (60 s), before which the cleaner keeps every
// record. A variable for tests.
var restampCheck = 15 * time.Second

// restampStale reads the offsets topic's new records and, for each
// partition this engine mirrors whose latest checkpoint or segment record
// is of an older lease generation than one read before (a write of an
// owner that lost its lease, delivered late), writes the partition's
// checkpoint and those segments again under its own generation. Without
// it, compaction would leave only the stale record, and the next reader
// would take it (issue 19: stale writes could roll a checkpoint back or
// overwrite a sealed translation segment). A partition not held is
// written anew by its next owner.
func (e *Engine) restampStale() {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	err := e.store.catchUp(ctx)
	cancel()
	if err != nil {
		if e.ctx.Err() == nil {
			e.log.Warn("reading the offsets topic for stale records failed; retried next round", zap.Error(err))
		}
		return
	}
	todo := e.store.takeRestamps()
	if len(todo) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, from := range todo {
		p, ok := e.parts[k]
		if !ok || !p.active() {
			continue
		}
		p.dirty = true
		if from != math.MaxInt64 {
			p.xl.dirtyFrom = min(p.xl.dirtyFrom, from)
		}
		e.log.Warn("an owner that lost its lease wrote this partition's checkpoint or translation late; writing them again under this lease",
			zap.Stringer("partition", k))
	}
}
