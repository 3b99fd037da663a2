package truncate

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
)

// StateTopic is the compacted topic on a mirror's destination cluster that
// holds the last mirrored position of every stopped partition (design.md
// section 8). Plain Kafka clients read it: keys and values are text.
const StateTopic = "__kmirror_state"

// LastMirrored is the value of a StateTopic record: where mirroring of one
// partition stopped (remove, failover), as JSON. A kmirror group beside the
// old source reads it to mirror the topic back (failback): the records of
// the destination partition below DestinationOffset are the source's
// records below SourceOffset.
type LastMirrored struct {
	Mirror    string `json:"mirror"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// SourceOffset is the next source offset not mirrored;
	// DestinationOffset the next destination offset (the destination
	// log end when mirroring stopped).
	SourceOffset      int64 `json:"source_offset"`
	DestinationOffset int64 `json:"destination_offset"`
	// SourceLeaderEpoch is the source leader epoch of the last mirrored
	// batch (KIP-320's epoch of the source log, -1 unknown): failback asks
	// the old source where that epoch ends (OffsetForLeaderEpoch) to find
	// records it wrote in a later epoch after an unclean election.
	SourceLeaderEpoch    int32  `json:"source_leader_epoch"`
	SourceClusterID      string `json:"source_cluster_id"`
	SourceTopicID        string `json:"source_topic_id"`
	DestinationClusterID string `json:"destination_cluster_id,omitempty"`
	DestinationTopicID   string `json:"destination_topic_id,omitempty"`
	// StoppedAtMs is when the position was recorded (Unix ms); Reason why
	// ("remove", "automatic failover: ...").
	StoppedAtMs int64  `json:"stopped_at_ms"`
	Reason      string `json:"reason,omitempty"`
}

// stateKeyPrefix starts every StateTopic key of a stopped partition.
const stateKeyPrefix = "stopped\x00"

// StateKey is the StateTopic key of a partition's LastMirrored record:
// "stopped", mirror, topic and partition, NUL-separated (neither mirror
// nor topic names can hold a NUL).
func StateKey(mirror, topic string, partition int32) []byte {
	return []byte(stateKeyPrefix + mirror + "\x00" + topic + "\x00" + strconv.Itoa(int(partition)))
}

// ParseLastMirrored decodes a StateTopic record; ok is false for records
// of another kind, and for tombstones.
func ParseLastMirrored(key, value []byte) (rec LastMirrored, ok bool, err error) {
	if !strings.HasPrefix(string(key), stateKeyPrefix) || value == nil {
		return LastMirrored{}, false, nil
	}
	if err := json.Unmarshal(value, &rec); err != nil {
		return LastMirrored{}, false, fmt.Errorf("%s record %q: %w", StateTopic, key, err)
	}
	return rec, true, nil
}

// ActiveMirror is the value of a topic's active record in the StateTopic
// of the cluster it is mirrored into, as JSON: the topic there is a mirror
// topic now (read-only until failover). The group beside that cluster
// writes it when it adds the topic and deletes it when a partition of the
// topic stops (remove, failover). A group beside the other cluster reads
// it to refuse an add that would mirror the topic back while it is
// mirrored (a loop; issue 21).
type ActiveMirror struct {
	Mirror               string `json:"mirror"`
	Topic                string `json:"topic"`
	SourceClusterID      string `json:"source_cluster_id"`
	SourceTopicID        string `json:"source_topic_id,omitempty"`
	DestinationClusterID string `json:"destination_cluster_id"`
	// SinceMs is when the group recorded it (Unix ms).
	SinceMs int64 `json:"since_ms"`
}

// ActiveMirrors returns the active records of a cluster's StateTopic (none
// when the topic does not exist).
func ActiveMirrors(ctx context.Context, a *kafka.Admin) ([]ActiveMirror, error) {
	raw, err := fetch.ActiveRecords(ctx, a, StateTopic)
	if err != nil {
		return nil, err
	}
	out := make([]ActiveMirror, 0, len(raw))
	for k, v := range raw {
		var rec ActiveMirror
		if err := json.Unmarshal(v, &rec); err != nil {
			return nil, fmt.Errorf("%s active record of %s/%s: %w", StateTopic, k.Mirror, k.Topic, err)
		}
		out = append(out, rec)
	}
	return out, nil
}
