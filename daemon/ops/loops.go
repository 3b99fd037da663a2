package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// Mirror loops (issue 21, section 4). Each group records the topics it
// mirrors into its destination as active records in the destination's
// __kmirror_state (truncate.ActiveMirror; a partition's stop deletes the
// record). Before adding topics, a group reads its source's: a source topic
// that is itself mirrored from this group's destination cluster would come
// back as a copy of a copy (an echo loop: every record duplicated on both
// clusters), and adding it over a topic the other side mirrors would take
// that topic from it. Such an add is refused, naming the other mirror and
// the safe order of steps. Topics mirrored in a chain (C to A, A to B) and
// active-active layouts (each cluster mirroring the other's own topics)
// close no loop and are accepted.

// loopGuard reads the source cluster's active records once and returns a
// check for each topic (nil: no loop). A source principal not allowed to
// read __kmirror_state (the least-privilege ACLs do not include it) turns
// the check off for this add, with a warning in the leader's log; any
// other failure to read it fails the add (ErrUnavailable).
func (o *Ops) loopGuard(ctx context.Context, src *kafka.Admin, mir raftstore.Mirror) (func(topic string) error, error) {
	dstID, err := o.dest.ClusterID(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	recs, err := truncate.ActiveMirrors(ctx, src)
	if kafka.SecurityFailure(err) {
		o.log.Warn("mirror loop check off for this add: the source principal cannot read the source's "+truncate.StateTopic+
			" (grant it READ there to have an add that would mirror a topic back refused)", zap.String("mirror", mir.Name), zap.Error(err))
		return func(string) error { return nil }, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: checking the source for mirrors in the other direction: %v", api.ErrUnavailable, err)
	}
	back := map[string]truncate.ActiveMirror{}
	for _, r := range recs {
		if r.SourceClusterID == dstID {
			back[r.Topic] = r
		}
	}
	return func(topic string) error {
		r, ok := back[topic]
		if !ok {
			return nil
		}
		return fmt.Errorf("%w: topic %s on the source cluster of mirror %s (cluster ID %s) is itself a mirror of this destination cluster "+
			"(cluster ID %s): mirror %s of the kmirror group beside the source has copied it from here since %s. Mirroring it back would close "+
			"a loop (each record would come back as a copy) and take the topic from that mirror. To make the source's copy the writable one "+
			"and mirror it back here (failback): on that group run kmirror remove --mirror %s --topic %s, then add it here again "+
			"(with --truncate if this cluster's topic has records the other side lacks; add --dry-run shows the plan)",
			api.ErrConflict, topic, mir.Name, r.DestinationClusterID, dstID, r.Mirror,
			time.UnixMilli(r.SinceMs).UTC().Format(time.RFC3339), r.Mirror, topic)
	}, nil
}

// recordActive writes topic's active record in the destination's
// __kmirror_state before the topic is added: from then on a group beside
// the source refuses to mirror it back.
func (o *Ops) recordActive(ctx context.Context, mir raftstore.Mirror, srcTopicID, topic string) error {
	if o.engine == nil {
		return nil // no data path (a member run for its lease alone): nothing is mirrored
	}
	dstID, err := o.dest.ClusterID(ctx)
	if err != nil {
		return err
	}
	srcID := mir.SourceClusterID
	if srcID == "" {
		src := o.member.SourceAdmin(mir)
		defer src.Close()
		if srcID, err = src.ClusterID(ctx); err != nil {
			return err
		}
	}
	v, err := json.Marshal(truncate.ActiveMirror{Mirror: mir.Name, Topic: topic, SourceClusterID: srcID, SourceTopicID: srcTopicID,
		DestinationClusterID: dstID, SinceMs: time.Now().UnixMilli()})
	if err != nil {
		return err
	}
	return o.engine.RecordActive(ctx, mir.Name, topic, v)
}

// reconcileActive makes the destination's active records of mirror match
// its topics (each config sync round, so a new leader and topics added by
// older builds are covered): a mirrored topic (MIRRORING, PAUSED, FAILED,
// DIVERGED) without one gets it; one of a topic the mirror no longer has,
// or has STOPPED, is deleted. PENDING and STOPPING topics are left to the
// add and the stop that write theirs.
func (o *Ops) reconcileActive(ctx context.Context, mir raftstore.Mirror) error {
	if o.engine == nil {
		return nil
	}
	recs, err := truncate.ActiveMirrors(ctx, o.dest)
	if err != nil {
		return err
	}
	// The state is read after the records: a stop that deleted a record
	// before they were read shows as STOPPING or STOPPED here, never as
	// mirrored, so its record is not written again.
	states, srcTopicIDs := map[string]raftstore.TopicState{}, map[string]string{}
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.Mirror == mir.Name {
				states[t.Topic], srcTopicIDs[t.Topic] = t.State, t.SourceTopicID
			}
		}
	})
	dstID, err := o.dest.ClusterID(ctx)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, r := range recs {
		if r.Mirror != mir.Name || r.DestinationClusterID != dstID {
			continue
		}
		have[r.Topic] = true
		if o.isAdding(raftstore.TopicKey(mir.Name, r.Topic)) {
			continue
		}
		if st, ok := states[r.Topic]; !ok || st == raftstore.StateStopped {
			if err := o.engine.RecordActive(ctx, mir.Name, r.Topic, nil); err != nil {
				return err
			}
		}
	}
	for topic, st := range states {
		switch st {
		case raftstore.StateMirroring, raftstore.StatePaused, raftstore.StateFailed, raftstore.StateDiverged:
			if !have[topic] && !o.isAdding(raftstore.TopicKey(mir.Name, topic)) {
				if err := o.recordActive(ctx, mir, srcTopicIDs[topic], topic); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// mirrored reports whether the replicated state holds topic of mirror in
// any state but STOPPED.
func (o *Ops) mirrored(mirror, topic string) bool {
	held := false
	o.store.Read(func(s *raftstore.State) {
		if t, ok := s.Topic(mirror, topic); ok {
			held = t.State != raftstore.StateStopped
		}
	})
	return held
}

// forgetActive deletes topic's active record, logging a failure (the next
// config sync round of the mirror deletes it then; a deleted mirror's
// has none, so DeleteMirror calls this for each topic first).
func (o *Ops) forgetActive(ctx context.Context, mirror, topic string) {
	if o.engine == nil {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), adminTimeout)
	defer cancel()
	if err := o.engine.RecordActive(actx, mirror, topic, nil); err != nil {
		o.log.Warn("delete the active record of a topic no longer mirrored", zap.String("mirror", mirror), zap.String("topic", topic), zap.Error(err))
	}
}
