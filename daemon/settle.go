package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// SettleUnverified verifies against mir's source the records a stop of
// partition i of t could not (PartitionInfo.UnverifiedEnd), writes the
// position they reach to the state topic and returns it with the
// partition's reason from now on: the topic's, or, when a record inside
// the range is not kmirror's copy of the source's, what the position
// leaves out (leader.Member). Other errors leave it for a later try.
func (m *Member) SettleUnverified(ctx context.Context, mir raftstore.Mirror, t raftstore.MirrorTopic, i int32) (raftstore.Position, string, error) {
	if int(i) >= len(t.Partitions) || t.Partitions[i].LastMirrored == nil {
		return raftstore.Position{}, "", fmt.Errorf("%s/%d has no recorded position", t.Topic, i)
	}
	p := t.Partitions[i]
	spec := fetch.Spec{Key: fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: i}, StartOffset: p.StartOffset,
		SourceTopicID: t.SourceTopicID, DestTopicID: t.DestTopicID}
	// The partition's recorded producer identity: batches written under
	// it since the checkpoint are kmirror's copies (a walk accepts no
	// other writer's, fetch.walk).
	if p.Producer.Allocated {
		spec.Producer = &kafka.ProducerID{ID: p.Producer.ProducerID, Epoch: p.Producer.Epoch}
	}
	m.engine.SetSource(mir.Name, m.Source(mir))
	pos, err := m.engine.SettleUnverified(ctx, spec, p.UnverifiedEnd)
	var dv *fetch.Divergence
	if err != nil && !errors.As(err, &dv) {
		return raftstore.Position{}, "", err
	}
	reason := t.Reason
	if dv != nil {
		reason = fmt.Sprintf("destination offsets %d..%d after the recorded position are not kmirror's copies of the source's records: %s",
			pos.DestinationOffset, p.UnverifiedEnd-1, dv.Reason)
		if t.Reason != "" {
			reason = t.Reason + "; " + reason
		}
	}
	rec := raftstore.Position{SourceOffset: pos.SourceOffset, DestinationOffset: pos.DestinationOffset, SourceLeaderEpoch: pos.SourceLeaderEpoch,
		SourceClusterID: p.LastMirrored.SourceClusterID, SourceTopicID: p.LastMirrored.SourceTopicID}
	if err := m.own.RecordLastMirrored(ctx, spec, rec, reason); err != nil {
		return raftstore.Position{}, "", fmt.Errorf("record the settled position of %s: %w", spec.Key, err)
	}
	return rec, reason, nil
}
