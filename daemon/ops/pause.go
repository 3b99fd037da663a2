package ops

import (
	"context"
	"fmt"
	"sort"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// PauseTopics pauses a topic of a mirror, or every MIRRORING topic of it
// when topic is "": each partition's owner drains what it fetched, writes
// a final checkpoint and fetches nothing more; leases and positions stay,
// and UnpauseTopics continues exactly from the checkpoint (verified by
// the resume walk). It returns the topics paused; a topic already PAUSED
// counts as done, and a mirror with nothing to pause returns none.
func (o *Ops) PauseTopics(ctx context.Context, mirror, topic string) ([]string, error) {
	return o.setPaused(ctx, mirror, topic, true)
}

// UnpauseTopics resumes PAUSED topics of a mirror (all of them when topic
// is ""), and returns them.
func (o *Ops) UnpauseTopics(ctx context.Context, mirror, topic string) ([]string, error) {
	return o.setPaused(ctx, mirror, topic, false)
}

func (o *Ops) setPaused(ctx context.Context, mirror, topic string, pause bool) ([]string, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return nil, err
		}
		if pause {
			return c.PauseTopics(ctx, mirror, topic)
		}
		return c.UnpauseTopics(ctx, mirror, topic)
	}
	from, to, verb := raftstore.StatePaused, raftstore.StateMirroring, "resume"
	if pause {
		from, to, verb = raftstore.StateMirroring, raftstore.StatePaused, "pause"
	}
	var topics []string
	mirrorFound, topicState := false, raftstore.TopicState("")
	o.store.Read(func(s *raftstore.State) {
		_, mirrorFound = s.Mirrors[mirror]
		for _, t := range s.Topics {
			if t.Mirror != mirror || (topic != "" && t.Topic != topic) {
				continue
			}
			topicState = t.State
			if t.State == from || (pause && t.State == raftstore.StateFailed) {
				topics = append(topics, t.Topic)
			}
		}
	})
	switch {
	case !mirrorFound:
		return nil, fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, mirror)
	case topic != "" && topicState == "":
		return nil, fmt.Errorf("%w: mirror %s has no topic %s (see kmirror describe --mirror %s)", api.ErrNotFound, mirror, topic, mirror)
	case topic != "" && topicState == to:
		return []string{topic}, nil // already done: running it twice is fine
	case topic != "" && len(topics) == 0:
		return nil, fmt.Errorf("%w: topic %s of mirror %s is %s: only a %s topic can %s", api.ErrConflict, topic, mirror, topicState, from, verb)
	case len(topics) == 0:
		return nil, nil
	}
	sort.Strings(topics)
	for _, t := range topics {
		if err := o.store.Apply(ctx, raftstore.SetTopicState{Mirror: mirror, Topic: t, State: to}); err != nil {
			return nil, StoreErr(err)
		}
		o.log.Info("topic "+verb+"d by the operator", zap.String("mirror", mirror), zap.String("topic", t))
	}
	return topics, nil
}
