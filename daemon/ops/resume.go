package ops

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// ResumePartitions resumes a PAUSED topic (UnpauseTopics), or restarts
// DIVERGED or FAILED partitions of a topic (all of them when
// req.Partitions is empty) under a new lease generation: the
// owner walks source and destination again, so a cause that is gone is
// verified, not assumed. With AcceptGap a partition whose source records
// were deleted before they were mirrored skips them once and counts them.
func (o *Ops) ResumePartitions(ctx context.Context, req api.ResumeRequest) ([]int32, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return nil, err
		}
		return c.ResumePartitions(ctx, req)
	}
	var states []raftstore.TopicState
	var gapBelow []int64
	var topicState raftstore.TopicState
	var mir raftstore.Mirror
	found, mirrorFound := false, false
	o.store.Read(func(s *raftstore.State) {
		if p, ok := s.Mirrors[req.Mirror]; ok {
			mir, mirrorFound = *p.Clone(), true
		}
		if t, ok := s.Topic(req.Mirror, req.Topic); ok {
			found, topicState = true, t.State
			for _, p := range t.Partitions {
				states = append(states, p.State)
				gapBelow = append(gapBelow, p.GapBelow)
			}
		}
	})
	if !mirrorFound {
		return nil, fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, req.Mirror)
	}
	if !found {
		return nil, fmt.Errorf("%w: mirror %s has no topic %s (see kmirror describe --mirror %s)", api.ErrNotFound, req.Mirror, req.Topic, req.Mirror)
	}
	if topicState == raftstore.StatePaused && len(req.Partitions) == 0 && !req.AcceptGap {
		if _, err := o.UnpauseTopics(ctx, req.Mirror, req.Topic); err != nil {
			return nil, err
		}
		all := make([]int32, len(states))
		for i := range all {
			all[i] = int32(i)
		}
		return all, nil
	}
	if topicState != raftstore.StateMirroring && topicState != raftstore.StateFailed {
		return nil, fmt.Errorf("%w: topic %s of mirror %s is %s: only partitions of a mirroring topic resume", api.ErrConflict, req.Topic, req.Mirror, topicState)
	}
	want := req.Partitions
	if len(want) == 0 {
		for i, st := range states {
			if st == raftstore.StateDiverged || st == raftstore.StateFailed {
				want = append(want, int32(i))
			}
		}
		if len(want) == 0 {
			return nil, nil // nothing to do: running resume twice is fine
		}
	}
	for _, p := range want {
		if p < 0 || int(p) >= len(states) {
			return nil, fmt.Errorf("%w: topic %s has partitions 0..%d, not %d", api.ErrInvalid, req.Topic, len(states)-1, p)
		}
		if st := states[p]; st != raftstore.StateDiverged && st != raftstore.StateFailed {
			return nil, fmt.Errorf("%w: partition %d of %s is %s, not DIVERGED or FAILED: nothing to resume", api.ErrConflict, p, req.Topic, st)
		}
	}
	var below []int64
	if req.AcceptGap {
		// Partitions not stopped by a gap accept none beyond the
		// source's log start of this moment.
		src := o.member.SourceAdmin(mir)
		defer src.Close()
		cctx, cancel := context.WithTimeout(ctx, adminTimeout)
		defer cancel()
		var err error
		if below, err = src.Offsets(cctx, req.Topic, len(states), kafka.Earliest); err != nil {
			return nil, fmt.Errorf("%w: reading the source's log start offsets to bound the accepted gap: %v", api.ErrUnavailable, err)
		}
	}
	for _, p := range want {
		k := raftstore.PartitionKey{Mirror: req.Mirror, Topic: req.Topic, Partition: p}
		cmd := raftstore.ResumePartition{Key: k, AcceptGap: req.AcceptGap}
		if req.AcceptGap {
			// The gap the operator was shown (describe), or, for a
			// partition stopped for another reason, none past the
			// source's log start now. 0 would mean unbounded.
			cmd.AcceptGapBelow = max(below[p], 1)
			if gapBelow[p] > 0 {
				cmd.AcceptGapBelow = gapBelow[p]
			}
		}
		if err := o.store.Apply(ctx, cmd); err != nil {
			return nil, StoreErr(err)
		}
		o.log.Info("partition resumed by the operator", zap.Stringer("partition", k), zap.Bool("accept_gap", req.AcceptGap))
	}
	return want, nil
}
