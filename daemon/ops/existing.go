package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// Adding a topic whose destination topic exists: a topic removed earlier
// in the same direction, or failback (design.md section 8). The plan comes
// from truncate.Find; here it is carried out.

// findExisting looks for the last mirrored position of topic (see
// truncate.Find); nil when there is none.
func (o *Ops) findExisting(ctx context.Context, src *kafka.Admin, mir raftstore.Mirror, topic string) (*truncate.Plan, error) {
	dstID, err := o.dest.ClusterID(ctx)
	if err != nil {
		return nil, err
	}
	srcID := mir.SourceClusterID
	if srcID == "" {
		if srcID, err = src.ClusterID(ctx); err != nil {
			return nil, err
		}
	}
	return truncate.Find(ctx, mir.Name, topic, truncate.Side{Admin: src, ClusterID: srcID}, truncate.Side{Admin: o.dest, ClusterID: dstID})
}

// existingTopic is the planned record of a topic that continues into its
// existing destination topic: MIRRORING at once, nothing to create.
func (o *Ops) existingTopic(mir raftstore.Mirror, srcTopic kafka.TopicMeta, plan *truncate.Plan) plannedTopic {
	mt := raftstore.MirrorTopic{Mirror: mir.Name, Topic: plan.Topic, State: raftstore.StatePending, SourceTopicID: srcTopic.ID,
		Partitions: make([]raftstore.PartitionInfo, len(plan.Partitions))}
	for i, pp := range plan.Partitions {
		start := pp.SourceOffset
		if len(pp.Translation) > 0 {
			start = min(start, pp.Translation[0].Src)
		}
		mt.Partitions[i] = raftstore.PartitionInfo{State: raftstore.StatePending, StartOffset: start}
	}
	return plannedTopic{topic: mt, existing: plan}
}

// divergentText names a divergent plan's records for an error.
func divergentText(p *truncate.Plan) string {
	var parts []string
	for _, pp := range p.Partitions {
		if pp.Divergent > 0 {
			parts = append(parts, fmt.Sprintf("partition %d: %d (%s)", pp.Partition, pp.Divergent, truncate.OffsetRange(pp.DivergentFrom, pp.DestinationEnd)))
		}
	}
	return fmt.Sprintf("destination topic %s has %d records past the last mirrored position of mirror %s (%s; %s): they would be hidden "+
		"under the mirrored ones", p.Topic, p.DivergentRecords(), p.From, p.Kind, strings.Join(parts, ", "))
}

// continueTopic seeds every partition's checkpoint and translation at the
// last mirrored position and records the topic: mirroring continues from
// there, copying only new records.
func (o *Ops) continueTopic(ctx context.Context, p plannedTopic) error {
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	for _, pp := range p.existing.Partitions {
		k := fetch.Key{Mirror: p.topic.Mirror, Topic: p.topic.Topic, Partition: pp.Partition}
		if err := o.engine.Seed(cctx, k, fetch.Entry{Src: pp.SourceOffset, Dst: pp.DestinationOffset}, pp.SourceLeaderEpoch, pp.Translation); err != nil {
			return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
		}
	}
	tm, err := o.dest.Topic(cctx, p.topic.Topic)
	if err != nil {
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	o.log.Info("topic continues from its last mirrored position", zap.String("mirror", p.topic.Mirror), zap.String("topic", p.topic.Topic),
		zap.String("kind", p.existing.Kind), zap.String("from", p.existing.From))
	t := p.topic
	t.DestTopicID = tm.ID
	key := raftstore.TopicKey(t.Mirror, t.Topic)
	defer o.markCreating(key)()
	if err := o.store.Apply(ctx, raftstore.AddTopic{Topic: t}); err != nil {
		return StoreErr(err)
	}
	return StoreErr(o.store.Apply(ctx, raftstore.SetTopicState{Mirror: t.Mirror, Topic: t.Topic,
		State: raftstore.StateMirroring, DestTopicID: tm.ID}))
}

// truncateAndAdd quarantines the divergent records of an existing
// destination topic, deletes the topic, and adds it afresh.
func (o *Ops) truncateAndAdd(ctx context.Context, src *kafka.Admin, mir raftstore.Mirror, p plannedTopic, rf int16) (truncate.Result, error) {
	if rf == 0 {
		rf = o.cfg.ReplicationFactor
	}
	tctx, cancel := context.WithTimeout(ctx, api.TruncateTimeout)
	defer cancel()
	positions, kept, err := o.keepGroupPositions(tctx, p)
	if err != nil {
		return truncate.Result{}, err
	}
	res, err := truncate.Truncate(tctx, o.dest, p.existing, rf)
	res.Groups = positions
	if err != nil {
		// Truncate deletes the topic last, but a delete that failed (a
		// timeout) may still have happened: the kept positions go only if
		// the topic is there with its groups' commits.
		cctx, cancel := context.WithTimeout(ctx, adminTimeout)
		_, terr := o.dest.Topic(cctx, p.topic.Topic)
		cancel()
		if kept && terr == nil {
			if cerr := o.store.Apply(ctx, raftstore.SetGroupRestores{Mirror: mir.Name, Topic: p.topic.Topic}); cerr != nil {
				o.log.Warn("kept group positions not cleared after a failed truncation", zap.String("topic", p.topic.Topic), zap.Error(cerr))
			}
		}
		return res, fmt.Errorf("%w: truncate %s: %v", api.ErrUnavailable, p.topic.Topic, err)
	}
	o.log.Warn("destination topic truncated: divergent records quarantined, topic deleted for its rebuild", zap.String("mirror", mir.Name),
		zap.String("topic", p.topic.Topic), zap.String("quarantine", res.Quarantine), zap.Int64s("copied", res.Copied))
	if err := o.engine.ForgetTopic(tctx, mir.Name, p.topic.Topic); err != nil {
		return res, fmt.Errorf("%w: clearing earlier checkpoints of %s: %v", api.ErrUnavailable, p.topic.Topic, err)
	}
	fresh, err := o.planTopic(tctx, src, mir, p.topic.Topic, kafka.Earliest, false)
	if err != nil {
		return res, err
	}
	return res, o.createTopic(ctx, fresh, rf)
}

// keepGroupPositions reads the destination groups' commits on a topic
// about to be truncated and records in raft, before anything is deleted,
// what each is given back as (State.GroupRestores; group sync commits them
// into the rebuilt topic). Groups with members refuse the truncation
// (api.ErrConflict, naming them). kept reports whether any was recorded.
func (o *Ops) keepGroupPositions(ctx context.Context, p plannedTopic) (positions []truncate.GroupPosition, kept bool, err error) {
	positions, err = truncate.GroupPositions(ctx, o.dest, p.existing)
	var busy *truncate.BusyGroupsError
	switch {
	case errors.As(err, &busy):
		return nil, false, fmt.Errorf("%w: %v. Nothing was truncated", api.ErrConflict, err)
	case err != nil:
		return nil, false, fmt.Errorf("%w: %v (kmirror gives every group its position back after --truncate, so it reads them first); "+
			"nothing was truncated", api.ErrUnavailable, err)
	}
	var restores []raftstore.GroupRestore
	for _, gp := range positions {
		if gp.SourceOffset < 0 {
			o.log.Warn("a consumer group's position on a truncated topic cannot be given back", zap.String("topic", p.topic.Topic),
				zap.String("group", gp.Group), zap.Int32("partition", gp.Partition), zap.String("why", gp.Reason))
			continue
		}
		restores = append(restores, raftstore.GroupRestore{Group: gp.Group, Partition: gp.Partition, DestinationCommitted: gp.Committed,
			SourceOffset: gp.SourceOffset, Metadata: gp.Metadata})
	}
	if len(restores) > 0 {
		if err := o.store.Apply(ctx, raftstore.SetGroupRestores{Mirror: p.topic.Mirror, Topic: p.topic.Topic, Restores: restores}); err != nil {
			return nil, false, StoreErr(err)
		}
		o.log.Info("consumer group positions kept for after the truncation", zap.String("topic", p.topic.Topic), zap.Int("positions", len(restores)))
	}
	return positions, len(restores) > 0, nil
}
