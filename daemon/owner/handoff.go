package owner

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// handoffDrainWait bounds a handoff's drain: the partition's queue
// produced and its final checkpoint written.
const handoffDrainWait = 30 * time.Second

// unansweredPoll is how often a draining handoff checks whether the
// destination still answers this member.
const unansweredPoll = 100 * time.Millisecond

// handOff gives partition j.spec.Key to the next owner. It drains the
// partition and releases it with its exact position, from which the next
// owner continues without a walk. While the destination does not answer
// this member (a produce of the partition left unanswered, or the
// member's destination probe failing; before or during the drain) the
// partition is not drained, since the drain would wait on the same link:
// it is dropped at once and released without a position, and the next
// owner resumes by the verified walk (issue 18: a drain over a stalled destination link
// timed out after 30 s, and the partition stood still meanwhile). A drain
// that fails for any reason, or does not end within handoffDrainWait, is
// dropped too before the release, so this member writes nothing once the
// next owner may.
//
// The handoff stops waiting for the drain as soon as the link is found
// stalled or the bound ends, without waiting for the drain to return: a
// drain of a partition that was not mirroring settles its position by a
// walk, which waits on locks that a checkpoint write or a read of the
// offsets topic holds while its own request to the stalled destination
// runs out (seen: a handoff that found the link stalled at once returned
// 50 s later, issue 22's CI). The drain, its context cancelled, sends and
// writes nothing more.
func (o *Owner) handOff(j ownerJob) {
	k := j.spec.Key
	ctx, cancel := context.WithTimeout(o.ctx, handoffDrainWait)
	defer cancel()
	stuck := make(chan struct{})
	go func() {
		t := time.NewTicker(unansweredPoll)
		defer t.Stop()
		for {
			// The member's view covers the partition's own produce.
			if !o.member.DestinationUnanswered().IsZero() {
				close(stuck)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	o.log.Info("handoff started", zap.Stringer("partition", k), zap.String("to", j.moveTo))
	type drained struct {
		h   *fetch.Handoff
		err error
	}
	done := make(chan drained, 1)
	go func() {
		h, err := o.engine.HandOff(ctx, k)
		done <- drained{h, err}
	}()
	var h *fetch.Handoff
	select {
	case d := <-done:
		h = d.h
		if d.err != nil {
			o.log.Warn("handoff drain failed; the next owner resumes with a walk", zap.Stringer("partition", k), zap.Error(d.err))
		}
	case <-stuck:
		o.log.Warn("handoff without a drain: the destination does not answer this member; the next owner resumes with a walk",
			zap.Stringer("partition", k))
	case <-ctx.Done():
		o.log.Warn("handoff drain did not end in time; the next owner resumes with a walk", zap.Stringer("partition", k),
			zap.Duration("waited", handoffDrainWait))
	}
	cancel()
	if h == nil {
		// Nothing of the partition may be in flight or sent later once the
		// release applies.
		dctx, dcancel := context.WithTimeout(o.ctx, handoffDrainWait)
		err := o.engine.Drop(dctx, k)
		dcancel()
		if err != nil {
			o.log.Warn("handoff: a produce of the partition is still in flight; releasing it once the next round finds none",
				zap.Stringer("partition", k), zap.Error(err))
			return
		}
	}
	o.release(j, h)
}

// release gives partition j.spec.Key up to its next owner, with h's exact
// position when the drain gave one (nil: the next owner walks). It runs on
// a bound of its own, never the drain's: a drain that timed out sent the
// release with its expired context, which never applied, and the handoff
// started over (issue 18).
func (o *Owner) release(j ownerJob, h *fetch.Handoff) {
	k := j.spec.Key
	cmd := raftstore.ReleasePartition{Key: partitionKey(k), Lease: j.lease}
	if h != nil {
		cmd.Checkpoint = &raftstore.Checkpoint{
			SourceOffset: h.Position.SourceOffset, DestinationOffset: h.Position.DestinationOffset,
			SourceLeaderEpoch: h.Position.SourceLeaderEpoch, Sequence: h.Sequence,
			Producer: raftstore.ProducerIdentity{ProducerID: h.Producer.ID, Epoch: h.Producer.Epoch, Allocated: true},
		}
	}
	ctx, cancel := context.WithTimeout(o.ctx, handoffDrainWait)
	defer cancel()
	if !o.submitRetry(ctx, cmd) {
		o.log.Warn("handoff: the release was not applied; the next round hands the partition off again", zap.Stringer("partition", k))
		return
	}
	o.owner.finish(k, j.kind, j.lease.Generation)
	o.log.Info("partition handed off", zap.Stringer("partition", k), zap.Bool("exact", h != nil))
}
