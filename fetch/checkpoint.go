package fetch

import (
	"context"
	"errors"
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
