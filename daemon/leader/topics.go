package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// topicCheckInterval is how often the leader compares every mirrored topic
// with its source and destination topics (design.md section 4, invariant
// 7): partitions added on the source, a topic deleted and recreated under
// the same name (a new topic ID).
const topicCheckInterval = 3 * time.Second

// topicWatch is the leader's view of the clusters for checkTopics: one
// admin connection per mirror's source cluster, kept between rounds.
type topicWatch struct {
	admins map[string]*kafka.Admin
	boot   map[string]string // Member.SourceKey the admin was made for
	// reported holds the divergences already applied, so a refused or
	// repeated one is not logged every round.
	reported map[string]bool
}

func (w *topicWatch) close() {
	for _, a := range w.admins {
		a.Close()
	}
	w.admins = nil
}

// source returns the admin for mirror's source cluster, replacing one whose
// bootstrap list changed.
func (w *topicWatch) source(l *Leader, mir raftstore.Mirror) *kafka.Admin {
	if w.admins == nil {
		w.admins, w.boot, w.reported = map[string]*kafka.Admin{}, map[string]string{}, map[string]bool{}
	}
	key := l.member.SourceKey(mir)
	if a, ok := w.admins[mir.Name]; ok && w.boot[mir.Name] == key {
		return a
	} else if ok {
		a.Close()
	}
	a := l.member.SourceAdmin(mir)
	w.admins[mir.Name], w.boot[mir.Name] = a, key
	return a
}

// topicLoop runs checkTopics every topicCheckInterval while ctx (the
// leadership) lasts, apart from the leader's reconcile loop so a slow
// source cluster never holds up assignments.
func (l *Leader) topicLoop(ctx context.Context) {
	var w topicWatch
	defer w.close()
	for {
		l.checkTopics(ctx, &w)
		select {
		case <-ctx.Done():
			return
		case <-time.After(topicCheckInterval):
		}
	}
}

// checkTopics is the leader's periodic comparison of mirrored topics with
// the clusters:
//
//   - a source topic with more partitions than the mirror topic: the
//     destination topic grows to the same count (CreatePartitions) and the
//     new partitions are mirrored from their start (AddPartitions);
//   - a source or destination topic whose topic ID is not the recorded one
//     was deleted and recreated under the same name: its partitions become
//     DIVERGED with that reason (the records no longer belong to the
//     topic that was mirrored), never mirrored on silently;
//   - a topic recorded without IDs (added by an older build) gets them.
//
// A topic missing on either side is left to the partitions' owners, which
// report it FAILED after a bounded wait (fetch.Engine).
func (l *Leader) checkTopics(ctx context.Context, w *topicWatch) {
	var topics []raftstore.MirrorTopic
	mirrors := map[string]raftstore.Mirror{}
	l.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.State != raftstore.StateMirroring && t.State != raftstore.StateFailed {
				continue
			}
			if mir, ok := s.Mirrors[t.Mirror]; ok {
				mirrors[t.Mirror] = *mir.Clone()
				topics = append(topics, *t.Clone())
			}
		}
	})
	for name := range w.admins {
		if _, ok := mirrors[name]; !ok {
			w.admins[name].Close()
			delete(w.admins, name)
		}
	}
	for _, t := range topics {
		if ctx.Err() != nil {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, adminTimeout)
		l.checkTopic(cctx, w, w.source(l, mirrors[t.Mirror]), t)
		cancel()
	}
}

func (l *Leader) checkTopic(ctx context.Context, w *topicWatch, src *kafka.Admin, t raftstore.MirrorTopic) {
	log := l.log.With(zap.String("mirror", t.Mirror), zap.String("topic", t.Topic))
	srcMeta, err := src.Topic(ctx, t.Topic)
	if err != nil {
		if !errors.Is(err, kafka.ErrTopicNotFound) {
			log.Debug("check source topic", zap.Error(err))
		}
		return
	}
	dstMeta, err := l.dest.Topic(ctx, t.Topic)
	if err != nil {
		if !errors.Is(err, kafka.ErrTopicNotFound) {
			log.Debug("check destination topic", zap.Error(err))
		}
		return
	}
	if t.SourceTopicID != "" && srcMeta.ID != "" && srcMeta.ID != t.SourceTopicID {
		l.divergeTopic(ctx, w, t, fmt.Sprintf("source topic %s was recreated: its topic ID is now %s, the mirrored topic's was %s. "+
			"The destination holds the old topic's records, and the new topic's offsets mean other records. To mirror the new topic: "+
			"kmirror remove --mirror %s --topic %s, delete topic %s on the destination cluster, then kmirror add it again",
			t.Topic, srcMeta.ID, t.SourceTopicID, t.Mirror, t.Topic, t.Topic))
		return
	}
	if t.DestTopicID != "" && dstMeta.ID != "" && dstMeta.ID != t.DestTopicID {
		l.divergeTopic(ctx, w, t, fmt.Sprintf("destination topic %s was recreated: its topic ID is now %s, the one kmirror created was %s; "+
			"kmirror does not write into a topic it did not create. Delete it on the destination cluster and kmirror remove --mirror %s --topic %s, "+
			"then kmirror add it again", t.Topic, dstMeta.ID, t.DestTopicID, t.Mirror, t.Topic))
		return
	}
	if (t.SourceTopicID == "" && srcMeta.ID != "") || (t.DestTopicID == "" && dstMeta.ID != "") {
		if err := l.store.Apply(ctx, raftstore.SetTopicIDs{Mirror: t.Mirror, Topic: t.Topic,
			SourceTopicID: srcMeta.ID, DestTopicID: dstMeta.ID}); err != nil {
			log.Warn("record topic IDs", zap.Error(err))
		}
	}
	if srcMeta.Partitions > len(t.Partitions) {
		l.growTopic(ctx, src, t, srcMeta.Partitions, dstMeta.Partitions)
	}
	if len(t.DeferredConfigs) > 0 {
		l.applyDeferred(ctx, t)
	}
}

// applyDeferred sets a topic's deferred compaction configs on the
// destination once every partition's checkpoint is past its DeferUntil
// offset (kafka.DeferCompaction), then clears them in the state.
func (l *Leader) applyDeferred(ctx context.Context, t raftstore.MirrorTopic) {
	for i, p := range t.Partitions {
		if i >= len(t.DeferUntil) {
			break // added later: created after the source was compacted
		}
		if t.DeferUntil[i] <= p.StartOffset {
			continue // nothing the mirror copies lies below it
		}
		pos, ok, err := l.member.Checkpointed(ctx, fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)})
		if err != nil || !ok || pos.SourceOffset < t.DeferUntil[i] {
			return
		}
	}
	log := l.log.With(zap.String("mirror", t.Mirror), zap.String("topic", t.Topic))
	if err := l.dest.AlterTopicConfigs(ctx, t.Topic, t.DeferredConfigs); err != nil {
		log.Warn("set the deferred compaction configs on the destination topic", zap.Error(err))
		return
	}
	if err := l.store.Apply(ctx, raftstore.DeferredApplied{Mirror: t.Mirror, Topic: t.Topic}); err != nil {
		log.Warn("record deferred configs applied", zap.Error(err))
		return
	}
	log.Info("backlog mirrored past every record the source held at add; destination topic now has the source's compaction configs",
		zap.Any("configs", t.DeferredConfigs))
}

// growTopic mirrors partitions added on the source: the destination topic
// grows first (so an owner never waits for a partition that does not
// exist), then the new partitions join the mirror topic, starting at the
// source's log start offset of each.
func (l *Leader) growTopic(ctx context.Context, src *kafka.Admin, t raftstore.MirrorTopic, want, dest int) {
	log := l.log.With(zap.String("mirror", t.Mirror), zap.String("topic", t.Topic))
	if dest < want {
		if err := l.dest.CreatePartitions(ctx, t.Topic, want); err != nil {
			log.Warn("grow destination topic to the source's partition count", zap.Int("partitions", want), zap.Error(err))
			return
		}
	}
	offsets, err := src.Offsets(ctx, t.Topic, want, kafka.Earliest)
	if err != nil {
		log.Warn("read start offsets of partitions added on the source", zap.Error(err))
		return
	}
	if err := l.store.Apply(ctx, raftstore.AddPartitions{Mirror: t.Mirror, Topic: t.Topic, Partitions: want,
		StartOffsets: offsets[len(t.Partitions):]}); err != nil {
		log.Warn("add partitions to the mirror topic", zap.Error(err))
		return
	}
	log.Info("source topic grew; mirroring its new partitions", zap.Int("from", len(t.Partitions)), zap.Int("to", want))
}

// divergeTopic marks every running partition of t DIVERGED (the control
// plane's decision: no lease) with reason.
func (l *Leader) divergeTopic(ctx context.Context, w *topicWatch, t raftstore.MirrorTopic, reason string) {
	for i, p := range t.Partitions {
		if p.State == raftstore.StateDiverged || p.State == raftstore.StateStopped || p.State == raftstore.StateStopping {
			continue
		}
		k := raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}
		if err := l.store.Apply(ctx, raftstore.SetPartitionState{Key: k, State: raftstore.StateDiverged, Reason: reason}); err != nil {
			l.log.Warn("mark partition diverged", zap.Stringer("partition", k), zap.Error(err))
			return
		}
	}
	key := raftstore.TopicKey(t.Mirror, t.Topic) + reason
	if !w.reported[key] {
		w.reported[key] = true
		l.log.Error("topic diverged", zap.String("mirror", t.Mirror), zap.String("topic", t.Topic), zap.String("reason", reason))
	}
}
