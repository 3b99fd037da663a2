package truncate

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
)

// Result is what Truncate did.
type Result struct {
	// Quarantine is the topic that holds the divergent records;
	// Copied[p] the records copied from partition p.
	Quarantine string  `json:"quarantine"`
	Copied     []int64 `json:"copied"`
	// Groups are the destination groups' positions on the deleted topic,
	// given back by group sync once the rebuilt topic is mirrored past
	// them (GroupPositions).
	Groups []GroupPosition `json:"groups,omitempty"`
}

// QuarantineName is the first free "TOPIC.kmirror-diverged.N" on dst.
func QuarantineName(ctx context.Context, dst *kafka.Admin, topic string) (string, error) {
	for n := 1; n < 1000; n++ {
		name := fmt.Sprintf("%s.kmirror-diverged.%d", topic, n)
		if len(name) > 249 {
			return "", fmt.Errorf("quarantine topic name %s is longer than Kafka's 249 characters", name)
		}
		_, err := dst.Topic(ctx, name)
		if errors.Is(err, kafka.ErrTopicNotFound) {
			return name, nil
		}
		if err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("topics %s.kmirror-diverged.1..999 all exist: delete old quarantine topics", topic)
}

// Truncate carries out a divergent plan on the destination cluster dst
// (design.md section 8): stock Kafka cannot cut a log's tail, so the
// divergent records of every partition are copied into a quarantine topic
// (same partition numbers, same content, kept forever: nothing is lost),
// the copies are checked, and then the destination topic is deleted. The
// caller then mirrors the topic from the source afresh. A failure before
// the delete leaves the destination topic as it was.
func Truncate(ctx context.Context, dst *kafka.Admin, plan *Plan, rf int16) (Result, error) {
	name, err := QuarantineName(ctx, dst, plan.Topic)
	if err != nil {
		return Result{}, err
	}
	configs := maps.Clone(kafka.MirrorTopicConfigs)
	configs["cleanup.policy"], configs["retention.ms"], configs["retention.bytes"] = "delete", "-1", "-1"
	if tc, err := dst.TopicConfigs(ctx, plan.Topic); err == nil && tc["max.message.bytes"] != "" {
		configs["max.message.bytes"] = tc["max.message.bytes"]
	}
	if err := dst.CreateTopic(ctx, name, len(plan.Partitions), rf, configs); err != nil {
		return Result{}, fmt.Errorf("create quarantine topic %s: %w", name, err)
	}
	res := Result{Quarantine: name, Copied: make([]int64, len(plan.Partitions))}
	for _, pp := range plan.Partitions {
		if pp.Divergent == 0 {
			continue
		}
		n, err := fetch.CopyRange(ctx, dst, plan.Topic, pp.Partition, pp.DivergentFrom, pp.DestinationEnd, name)
		if err != nil {
			return res, fmt.Errorf("copy the divergent records of %s/%d into %s (it holds a partial copy now: delete it before trying "+
				"again; %s is unchanged): %w", plan.Topic, pp.Partition, name, plan.Topic, err)
		}
		res.Copied[pp.Partition] = n
	}
	ends, err := dst.HighWatermarks(ctx, name, len(plan.Partitions))
	if err != nil {
		return res, fmt.Errorf("check quarantine topic %s: %w", name, err)
	}
	for p, n := range res.Copied {
		if ends[p] != n {
			return res, fmt.Errorf("quarantine topic %s partition %d holds %d records, %d were copied: %s is left unchanged; "+
				"delete %s and try again", name, p, ends[p], n, plan.Topic, name)
		}
	}
	if err := dst.DeleteTopic(ctx, plan.Topic); err != nil {
		return res, fmt.Errorf("delete %s for its rebuild (its divergent records are in %s): %w", plan.Topic, name, err)
	}
	return res, nil
}
