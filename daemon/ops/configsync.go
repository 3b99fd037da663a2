package ops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// Topic configs kept in sync (issue 21): `add` copies the source topic's
// effective configs once (kafka.Admin.TopicConfigs: retention, limits,
// compaction, storage); every topics.config.sync.interval the leader
// compares them with the destination topic's and applies the changed
// ones with IncrementalAlterConfigs (leader.configSyncLoop). Left alone:
// the configs in topics.config.exclude; those kmirror sets itself
// (message.timestamp.*, kafka.MirrorTopicConfigs, which both sides read
// the same); the deferred compaction configs of a topic still catching
// up (kafka.DeferCompaction: they land once it has); and a change of
// cleanup.policy that adds compaction, which would make the destination
// refuse keyless records the source still holds from before (the
// reason says so and names `remove` + `add`, which defers it). A change
// the destination refuses is recorded on the topic with the broker's
// words (describe's reason) and tried again at the next round.

// SyncTopicConfigs runs one config sync round for mirror's MIRRORING
// topics. An error means the round could not run or stopped (a cluster
// did not answer: kafka.IsBrokerAnswer false); a broker's refusal for one
// topic, or a held change, is recorded on that topic instead.
func (o *Ops) SyncTopicConfigs(ctx context.Context, mirror string) error {
	var mir *raftstore.Mirror
	var topics []raftstore.MirrorTopic
	all := map[string]bool{} // every topic of the mirror: still mirrored (not STOPPED)?
	o.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[mirror]; ok {
			mir = m.Clone()
		}
		for _, t := range s.Topics {
			if t.Mirror != mirror || t.State == raftstore.StatePending {
				continue
			}
			all[t.Topic] = t.State != raftstore.StateStopped
			if t.State == raftstore.StateMirroring {
				topics = append(topics, *t.Clone())
			}
		}
	})
	if mir == nil || o.dest == nil {
		return nil
	}
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return err
	}
	rctx, rcancel := context.WithTimeout(ctx, adminTimeout)
	err = o.reconcileActive(rctx, *mir)
	rcancel()
	switch {
	case err != nil && kafka.IsBrokerAnswer(err):
		o.log.Warn("recording the mirrored topics in the destination's "+truncate.StateTopic, zap.String("mirror", mirror), zap.Error(err))
	case err != nil:
		return fmt.Errorf("recording the mirrored topics in the destination's %s: %w", truncate.StateTopic, err)
	}
	src := o.member.SourceAdmin(*mir)
	defer src.Close()
	if !settings.ACLSync && len(mir.SyncedACLs) > 0 {
		// Turned off: the ACLs it created stay (applications may rely on
		// them) and are no longer kmirror's.
		if err := o.setSyncedACLs(ctx, mir, nil); err != nil {
			o.log.Warn("ACL sync turned off", zap.String("mirror", mirror), zap.Error(err))
		}
	}
	if settings.ACLSync {
		actx, cancel := context.WithTimeout(ctx, adminTimeout)
		err := o.syncACLs(actx, mir, settings, src, all)
		cancel()
		if err != nil {
			o.log.Warn("ACL sync", zap.String("mirror", mirror), zap.Error(err))
		}
	}
	o.recordNotes(ctx, mir, src)
	slices.SortFunc(topics, func(a, b raftstore.MirrorTopic) int { return strings.Compare(a.Topic, b.Topic) })
	for _, t := range topics {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cctx, cancel := context.WithTimeout(ctx, adminTimeout)
		want, err := src.TopicConfigs(cctx, t.Topic)
		if err == nil {
			var have map[string]string
			if have, err = o.dest.TopicConfigs(cctx, t.Topic); err == nil {
				change, held := configChanges(want, have, settings.ConfigExclude, t.DeferredConfigs)
				switch {
				case len(change) > 0:
					if err = o.dest.AlterTopicConfigs(cctx, t.Topic, change); err == nil {
						o.log.Info("source topic configs changed: applied to the mirror topic", zap.String("mirror", mirror),
							zap.String("topic", t.Topic), zap.Any("configs", change))
					} else {
						err = fmt.Errorf("the destination refused the source's new configs %v: %w", change, err)
					}
				case held != "":
					err = errHeld{held}
				}
			}
		}
		cancel()
		if err != nil && !errors.As(err, new(errHeld)) && !kafka.IsBrokerAnswer(err) {
			// A cluster that did not answer (down, stalled, restarting)
			// is no fault of this topic: the round stops, the topics keep
			// what they showed, and the leader tries again soon.
			return fmt.Errorf("topic %s: %w", t.Topic, err)
		}
		why := ""
		if err != nil {
			why = err.Error()
		}
		if why != t.ConfigSyncError {
			if aerr := StoreErr(o.store.Apply(ctx, raftstore.SetConfigSyncError{Mirror: mirror, Topic: t.Topic, Error: why})); aerr != nil {
				o.log.Warn("record a config sync result", zap.String("topic", t.Topic), zap.Error(aerr))
			}
		}
	}
	return nil
}

// configChanges returns the source's values (want) the destination's
// (have) lack, without the excluded and deferred ones; held says why a
// change was left out on purpose ("" for none).
func configChanges(want, have map[string]string, exclude []string, deferred map[string]string) (change map[string]string, held string) {
	change = map[string]string{}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		v := want[k]
		if have[k] == v || slices.Contains(exclude, k) {
			continue
		}
		if _, ok := deferred[k]; ok {
			continue // applied once the topic is caught up (DeferCompaction)
		}
		if k == "cleanup.policy" && strings.Contains(v, "compact") && !strings.Contains(have[k], "compact") {
			held = fmt.Sprintf("config sync: the source topic became cleanup.policy=%s; it is not copied while mirroring (the destination would "+
				"refuse keyless records the source still holds from before): kmirror remove, then add the topic again, defers it safely, "+
				"or set it on the destination yourself", v)
			continue
		}
		change[k] = v
	}
	return change, held
}

// configSyncReason is describe's reason for a MIRRORING partition of a
// topic whose last config sync failed.
func configSyncReason(t *raftstore.MirrorTopic) string {
	if t.ConfigSyncError == "" {
		return ""
	}
	if strings.HasPrefix(t.ConfigSyncError, "config sync: ") {
		return t.ConfigSyncError
	}
	return "config sync: " + t.ConfigSyncError + " (tried again every topics.config.sync.interval)"
}

// errHeld is a config change kmirror holds back on purpose (see
// configChanges); its text says why and what to do.
type errHeld struct{ why string }

func (e errHeld) Error() string { return e.why }
