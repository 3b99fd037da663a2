package fetch

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// Ending a partition's run on this member: Release and HandOff (drain and
// checkpoint), Stop and Settle (the exact last mirrored position, by a walk
// where needed), and Drop (at once, when the lease moved).

// Drop stops a partition at once, without draining its queue or writing a
// checkpoint: its lease moved to another member, which resumes from the
// last checkpoint with a walk. It returns once no produce of the partition
// is in flight; if ctx ends first it returns ctx's error, and the
// partition still leaves the engine once that produce ends (its own bound,
// produce_timeout + 10 s): left listed and dropped, a later Assign would
// find it so and never start it again.
func (e *Engine) Drop(ctx context.Context, k Key) error {
	e.mu.Lock()
	p, ok := e.parts[k]
	if !ok {
		e.mu.Unlock()
		return nil
	}
	e.dropLocked(p)
	e.mu.Unlock()
	err := e.forget(ctx, k, p)
	if err != nil {
		go func() { _ = e.forget(e.ctx, k, p) }()
	}
	return err
}

// dropLocked stops p at once: no batch of it is collected for produce
// from now on (its queue is dropped and a pending restart stopped).
func (e *Engine) dropLocked(p *partition) {
	p.gen++
	e.dropQueueLocked(p)
	if p.release != releaseDropped { // a second Drop while the first waits finds it dropped
		p.moveRelease(releaseDropped)
		p.moveLife(lifeStopped)
	}
}

// forget removes dropped partition p from the engine once no produce of
// it is in flight; until then a Stop finds it and waits for that produce
// before it settles the position.
func (e *Engine) forget(ctx context.Context, k Key, p *partition) error {
	err := e.waitIdle(ctx, p, -1)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if e.parts[k] == p {
		delete(e.parts, k)
		e.heldVersion++
	}
	e.mu.Unlock()
	return nil
}

func closeOnce(p *partition) {
	select {
	case <-p.released:
	default:
		close(p.released)
	}
}

// Release stops mirroring a partition gracefully: no more fetching, every
// fetched batch produced, a final checkpoint written. It returns the last
// mirrored position. A partition that was not mirroring cleanly (starting,
// failed, diverged, or failed while draining) may have had a batch land
// whose answer was lost: its position is settled by walking the
// destination instead. The partition is dropped even when Release fails
// (its context ends before the drain): nothing more of it is sent, it
// leaves the engine once no produce of it is in flight, and a later lease
// resumes it from its checkpoint with a walk.
func (e *Engine) Release(ctx context.Context, k Key) (Position, error) {
	pos, _, err := e.release(ctx, k)
	return pos, err
}

// HandOff releases a partition for a graceful handoff and returns its
// exact position, from which the next owner continues without a walk.
// It returns nil when the drain was not clean (the partition was not
// mirroring): the next owner then resumes with the verified walk.
func (e *Engine) HandOff(ctx context.Context, k Key) (*Handoff, error) {
	e.mu.Lock()
	p, ok := e.parts[k]
	var id kafka.ProducerID
	if ok {
		id = p.producer
	}
	e.mu.Unlock()
	if !ok {
		return nil, nil // nothing runs here: the next owner walks
	}
	pos, settled, err := e.release(ctx, k)
	if err != nil || settled {
		return nil, err
	}
	e.mu.Lock()
	seq := p.nextSeq
	e.mu.Unlock()
	return &Handoff{Position: pos, Sequence: seq, Producer: id}, nil
}

// Stop ends the mirroring of a partition for good (remove, failover) and
// returns its exact last mirrored position: Release, then, unless Release
// already settled the position by a walk, a walk from the final checkpoint
// to the end of the destination leader's log (Settle). A late copy of one of
// kmirror's own batches that landed after the last acknowledged one is thus
// stepped over and counted rather than recorded as mirrored data, and a
// consumer that fails over at the recorded position reads no record twice.
// A partition this engine does not hold is settled the same way.
func (e *Engine) Stop(ctx context.Context, spec Spec) (Position, error) {
	pos, settled, err := e.release(ctx, spec.Key)
	if errors.Is(err, ErrUnknownPartition) || (err == nil && !settled) {
		return e.Settle(ctx, spec)
	}
	return pos, err
}

// release is Release; settled reports that the position came from a walk.
func (e *Engine) release(ctx context.Context, k Key) (pos Position, settled bool, err error) {
	losses := e.ctl.LeaseLosses()
	e.mu.Lock()
	p, ok := e.parts[k]
	if !ok {
		e.mu.Unlock()
		return Position{}, false, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	if p.released == nil {
		p.released = make(chan struct{})
	}
	if p.spec.Fences != losses && p.release != releaseDropped {
		// Assigned before the latest lease loss: its queue may not be
		// sent (collectProduce), so it cannot drain; it is dropped now
		// and its position settled by the walk, instead of waiting out
		// the caller's bound.
		e.dropLocked(p)
	}
	if p.release != releaseDropped { // a release after a Drop finds it stopped
		p.moveRelease(releaseDraining)
	}
	if p.active() { // now DRAINING
		if p.drained() {
			closeOnce(p)
		}
	} else {
		p.gen++ // stop a pending restart
		closeOnce(p)
	}
	done := p.released
	e.mu.Unlock()
	kick(e.kickRt)
	select {
	case <-done:
	case <-ctx.Done():
		// The partition leaves the engine all the same (issue 19: it
		// stayed DRAINING and went on sending after the caller gave up,
		// and after a handoff's release let the next owner write): no
		// batch of it is sent from now on, and it is forgotten once its
		// in-flight produce, if any, has ended.
		e.mu.Lock()
		e.dropLocked(p)
		e.mu.Unlock()
		go func() {
			// Bound by the engine alone: the produce in flight ends within
			// its own bound (produce_timeout + 10 s, sender.go). A bound
			// here that gave up first would leave the partition listed
			// and dropped, and a later Assign of it would find it so and
			// never start it again.
			if err := e.forget(e.ctx, k, p); err != nil && e.ctx.Err() == nil {
				e.log.Warn("a dropped partition could not be forgotten", zap.Stringer("partition", k), zap.Error(err))
			}
		}()
		return Position{}, false, fmt.Errorf("drain %s: %w; the partition is dropped: nothing more of it is sent, and its next run resumes from its checkpoint with a walk", k, ctx.Err())
	}
	defer func() {
		e.mu.Lock()
		if e.parts[k] == p {
			delete(e.parts, k)
			e.heldVersion++
		}
		e.mu.Unlock()
	}()
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	clean := p.reported() == Draining
	pos, spec, resumed := p.pos, p.spec, p.resumed
	up := e.updateLocked(p)
	e.mu.Unlock()
	if !clean {
		if err := e.waitIdle(ctx, p, -1); err != nil {
			return Position{}, false, err
		}
		if resumed { // its acknowledged progress first: the walk starts there
			if err := e.store.write(ctx, []update{up}); err != nil {
				return Position{}, false, fmt.Errorf("checkpoint of %s: %w", k, err)
			}
		}
		pos, err := e.settle(ctx, spec)
		return pos, true, err
	}
	if err := e.store.write(ctx, []update{up}); err != nil {
		return Position{}, false, fmt.Errorf("final checkpoint of %s: %w", k, err)
	}
	return pos, false, nil
}

// Settle returns the exact mirrored position of a partition this engine
// does not mirror now: from its last checkpoint (or start offset) it walks
// the source and the destination up to the destination's high watermark,
// so a batch that landed after the checkpoint is counted, and records the
// result as a checkpoint. A walk that finds a divergence falls back to the
// checkpoint, which is then the last position known to match.
func (e *Engine) Settle(ctx context.Context, spec Spec) (Position, error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	return e.settle(ctx, spec)
}

func (e *Engine) settle(ctx context.Context, spec Spec) (Position, error) {
	for attempt := 0; ; attempt++ {
		pos, err := e.settleOnce(ctx, spec, attempt >= behindRetries)
		var sb *sourceBehind
		if !errors.As(err, &sb) {
			return pos, err
		}
		// Records past the source's end: retried as resume retries them
		// (a source leader's last stable offset lags briefly after a
		// leader change), then taken as a divergence.
		if sleepCtx(ctx, e.cfg.RetryBackoff<<attempt); ctx.Err() != nil {
			return Position{}, err
		}
	}
}

// settleFrom is where a settling walk of a partition starts: its last
// checkpoint (or start offset), with the translation and producer identity
// recorded there.
type settleFrom struct {
	src        *source
	start      Entry
	startEpoch int32
	known      Position // the checkpoint's position
	pid        kafka.ProducerID
	seq        int32
	// also are the partition's other recorded producer identities (the
	// lease's, a handoff's): batches written under them since the
	// checkpoint are kmirror's too.
	also []kafka.ProducerID
	xl   Translation
	// gen is the lease generation the settling walk runs under: its
	// checkpoint is stamped with it.
	gen uint64
}

// settleStart reads partition spec.Key's last checkpoint.
func (e *Engine) settleStart(ctx context.Context, spec Spec) (settleFrom, error) {
	k := spec.Key
	e.mu.Lock()
	src := e.sources[k.Mirror]
	e.mu.Unlock()
	if err := e.store.catchUp(ctx); err != nil {
		return settleFrom{}, fmt.Errorf("read checkpoints: %w", err)
	}
	cp, hasCP, xl, err := e.store.load(ctx, k, Entry{Src: spec.StartOffset})
	if err != nil {
		return settleFrom{}, err
	}
	xl.SetLimit(e.cfg.TranslationMaxBytes)
	f := settleFrom{src: src, start: Entry{Src: spec.StartOffset}, startEpoch: -1, pid: kafka.ProducerID{ID: -1}, xl: xl, gen: spec.Generation}
	if hasCP {
		f.start = Entry{Src: cp.Src, Dst: cp.Dst}
		f.pid = kafka.ProducerID{ID: cp.PID, Epoch: cp.Epoch}
		f.startEpoch, f.seq = cp.LeaderEpoch, cp.Seq
	}
	if spec.Producer != nil {
		f.also = append(f.also, *spec.Producer)
	}
	if spec.Handoff != nil {
		f.also = append(f.also, spec.Handoff.Producer)
	}
	f.known = Position{SourceOffset: f.start.Src, DestinationOffset: f.start.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
	return f, nil
}

// walk walks the partition from f's checkpoint to the end of the
// destination leader's log (Engine.walk).
func (f *settleFrom) walk(ctx context.Context, e *Engine, k Key) (walkResult, error) {
	if f.src == nil {
		return walkResult{}, fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
	}
	own := ownSeqs{f.pid: f.seq}
	for _, id := range f.also {
		if _, ok := own[id]; !ok {
			own[id] = 0
		}
	}
	return e.walk(ctx, f.src.cl, k, f.start, f.startEpoch, f.pid, own, &f.xl, -1)
}

// record writes the position a settling walk reached as k's checkpoint
// and returns it.
func (f *settleFrom) record(ctx context.Context, e *Engine, k Key, w walkResult) (Position, error) {
	for _, d := range w.duplicates {
		e.logDuplicate(k, d)
	}
	segs, dropped := f.xl.takeUnsaved()
	up := update{key: k, gen: f.gen, segs: segs, dropped: dropped, cp: checkpoint{Src: w.end.Src, Dst: w.end.Dst, Seq: w.nextSeq,
		PID: f.pid.ID, Epoch: f.pid.Epoch, LeaderEpoch: w.epoch, Floor: f.xl.Floor()}}
	if err := e.store.write(ctx, []update{up}); err != nil {
		return Position{}, fmt.Errorf("checkpoint of %s: %w", k, err)
	}
	return Position{SourceOffset: w.end.Src, DestinationOffset: w.end.Dst, SourceLeaderEpoch: w.epoch}, nil
}

// settleOnce is one try of settle; with lastTry, a walk that finds
// destination records past the source's end is a divergence (else that
// sourceBehind error is returned).
func (e *Engine) settleOnce(ctx context.Context, spec Spec, lastTry bool) (Position, error) {
	k := spec.Key
	f, err := e.settleStart(ctx, spec)
	if err != nil {
		return Position{}, err
	}
	// Nothing landed after the checkpoint: it is the exact position, and
	// the source need not answer (an emergency failover with the source
	// gone).
	hw, err := e.dest.ListOffset(ctx, k.Topic, k.Partition, kafka.Latest)
	if err == nil && hw == f.start.Dst {
		return f.known, nil
	}
	if f.src == nil {
		return f.known, fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
	}
	w, err := f.walk(ctx, e, k)
	var dv *Divergence
	var sb *sourceBehind
	switch {
	case errors.As(err, &dv), errors.As(err, &sb) && lastTry:
		e.log.Warn("settling a diverged partition at its last checkpoint", zap.Stringer("partition", k), zap.Error(err))
		return f.known, nil
	case sb != nil:
		return Position{}, err // settle tries again
	}
	if err != nil && ctx.Err() == nil && hw > f.start.Dst {
		return Position{}, &UnverifiedError{Key: k, Known: f.known, End: hw, Err: err}
	}
	if err != nil {
		return Position{}, fmt.Errorf("settle position of %s: %w", k, err)
	}
	return f.record(ctx, e, k, w)
}

// SettleUnverified verifies the records a stop could not (UnverifiedError),
// once the source answers again: the destination from the partition's
// last checkpoint up to end (exclusive; the destination's end at the
// stop). The topic is writable since the stop, so the walk meets the
// applications' records after end; it returns the position up to which
// the destination holds kmirror's copies of the source's records, and
// records it as the checkpoint. When those end before end (a record there
// is not the source's, or the source lost records it had), it returns that
// position with a *Divergence saying why. Other errors (the source or the
// destination does not answer, the source serves less than the
// destination holds) leave the position unknown: try again.
func (e *Engine) SettleUnverified(ctx context.Context, spec Spec, end int64) (Position, error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	k := spec.Key
	f, err := e.settleStart(ctx, spec)
	if err != nil {
		return Position{}, err
	}
	w, err := f.walk(ctx, e, k)
	var dv *Divergence
	var sb *sourceBehind
	switch {
	case errors.As(err, &sb) && w.end.Dst >= end:
		// The applications' records after the stop, past the source's end.
	case errors.As(err, &dv):
	case err != nil:
		// A returning source leader's last stable offset may lag for a
		// while (sourceBehind before end): try again.
		return Position{}, fmt.Errorf("settle unverified records of %s: %w", k, err)
	}
	pos, err := f.record(ctx, e, k, w)
	if err != nil {
		return Position{}, err
	}
	if pos.DestinationOffset < end {
		if dv == nil {
			dv = &Divergence{Key: k, Reason: fmt.Sprintf("the destination log ends at offset %d, before %d where it ended at the stop", pos.DestinationOffset, end)}
		}
		return pos, dv
	}
	return pos, nil
}

// UnverifiedError: the destination holds records past a partition's last
// checkpoint (Known) up to End that could not be verified against the
// source (Err: usually, the source does not answer). They are kmirror's
// own batches whose acknowledgement was lost, but which source records
// they copy cannot be known without the source.
type UnverifiedError struct {
	Key   Key
	Known Position
	End   int64
	Err   error
}

func (e *UnverifiedError) Error() string {
	return fmt.Sprintf("settle position of %s: destination offsets %d..%d past the last checkpoint cannot be verified against the source: %v",
		e.Key, e.Known.DestinationOffset, e.End-1, e.Err)
}

func (e *UnverifiedError) Unwrap() error { return e.Err }

// RecordStopped writes a stopped partition's last mirrored position to the
// state topic, where the other side can read it with plain Kafka. It fails
// without writing when this member's lease has ended
// (Control.WriteDeadline).
func (e *Engine) RecordStopped(ctx context.Context, k Key, rec any) error {
	return e.store.writeStopped(ctx, e.cfg.StateTopic, k, rec)
}

// StoppedTranslation returns the translation of a partition this engine
// no longer mirrors, from its last checkpoint in the offsets topic, with
// Engine.TranslateCommitted's contract (the final group sync of remove).
func (e *Engine) StoppedTranslation(ctx context.Context, spec Spec) (func(k Key, sourceOffset int64) (int64, bool, error), error) {
	if err := e.store.catchUp(ctx); err != nil {
		return nil, fmt.Errorf("read checkpoints: %w", err)
	}
	_, hasCP, xl, err := e.store.load(ctx, spec.Key, Entry{Src: spec.StartOffset})
	if err != nil {
		return nil, err
	}
	if !hasCP {
		return nil, fmt.Errorf("%s has no checkpoint", spec.Key)
	}
	return func(k Key, o int64) (int64, bool, error) {
		if k != spec.Key {
			return 0, false, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
		}
		return translateCommitted(&xl, k, spec.StartOffset, o)
	}, nil
}
