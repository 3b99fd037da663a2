package truncate

import (
	"context"
	"fmt"
	"sort"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// GroupPosition is a destination consumer group's committed position on a
// partition of a topic that a truncation is about to delete, and what it
// is given back as after the rebuild (issue 21, section 4: Kafka drops a
// deleted topic's committed offsets, and a consumer would then start over
// from auto.offset.reset).
type GroupPosition struct {
	Group     string `json:"group"`
	Partition int32  `json:"partition"`
	// Committed is the group's commit on the destination topic (offsets);
	// Kept is that commit clamped to the truncation point (DivergentFrom:
	// a position past it pointed into the quarantined records).
	Committed int64  `json:"committed"`
	Kept      int64  `json:"kept"`
	Metadata  string `json:"metadata,omitempty"`
	// SourceOffset is Kept mapped through the old mirror's translation to
	// the source's offsets: the first record at or after Kept that was
	// mirrored. Group sync translates it into the rebuilt topic the way it
	// translates a source commit. -1 when it cannot be mapped (Reason).
	SourceOffset int64  `json:"source_offset"`
	Reason       string `json:"reason,omitempty"`
}

// BusyGroupsError names the destination groups with members that have
// committed offsets on a topic a truncation would delete: their consumers
// would read a topic that vanishes under them and start over.
type BusyGroupsError struct {
	Topic  string
	Groups []string // "group (state)"
}

func (e *BusyGroupsError) Error() string {
	return fmt.Sprintf("consumer groups with members on the destination have committed offsets on %s: %v; --truncate deletes the topic under "+
		"them: stop their consumers there (kmirror gives each group its position back, clamped to the truncation point, once the "+
		"rebuilt topic is mirrored past it) and run add --truncate again", e.Topic, e.Groups)
}

// GroupPositions reads every destination group's commits on plan's topic
// and maps each to the source offset it is given back as. A group with
// members (state other than Empty or Dead) that committed on the topic
// makes the error a *BusyGroupsError, returned with all positions; a group whose commits cannot be read is
// an error too, so that no position is lost without a word.
func GroupPositions(ctx context.Context, dst *kafka.Admin, plan *Plan) ([]GroupPosition, error) {
	groups, err := dst.ListGroups(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the destination's consumer groups: %w", err)
	}
	parts := make([]kafka.TopicPartition, len(plan.Partitions))
	for i, pp := range plan.Partitions {
		parts[i] = kafka.TopicPartition{Topic: plan.Topic, Partition: pp.Partition}
	}
	var out []GroupPosition
	busy := &BusyGroupsError{Topic: plan.Topic}
	seen := map[string]bool{}
	for _, g := range groups {
		if seen[g.ID] || g.Type == "share" {
			continue // share groups keep no committed offsets
		}
		seen[g.ID] = true
		committed, err := dst.CommittedOffsets(ctx, g.ID, parts)
		if err != nil {
			return nil, fmt.Errorf("read the committed offsets of consumer group %s on %s: %w", g.ID, plan.Topic, err)
		}
		if len(committed) == 0 {
			continue
		}
		if g.State != "" && g.State != "Empty" && g.State != "Dead" {
			busy.Groups = append(busy.Groups, fmt.Sprintf("%s (%s)", g.ID, g.State))
		}
		for _, pp := range plan.Partitions {
			c, ok := committed[kafka.TopicPartition{Topic: plan.Topic, Partition: pp.Partition}]
			if !ok || c.Offset < 0 {
				continue
			}
			out = append(out, positionOf(g.ID, pp, c))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Group < out[j].Group || (out[i].Group == out[j].Group && out[i].Partition < out[j].Partition)
	})
	if len(busy.Groups) > 0 {
		sort.Strings(busy.Groups)
		return out, busy
	}
	return out, nil
}

// positionOf clamps commit c of group on partition pp to the truncation
// point and maps it to the source's offsets.
func positionOf(group string, pp PartitionPlan, c kafka.Committed) GroupPosition {
	gp := GroupPosition{Group: group, Partition: pp.Partition, Committed: c.Offset, Kept: min(c.Offset, pp.DivergentFrom),
		Metadata: c.Metadata, SourceOffset: -1}
	switch {
	case gp.Kept >= pp.DestinationOffset:
		gp.SourceOffset = pp.SourceOffset
	case len(pp.Translation) == 0:
		gp.Reason = fmt.Sprintf("offset %d is below the last mirrored position %d and the old mirror left no translation for it", gp.Kept, pp.DestinationOffset)
	case gp.Kept < pp.Translation[0].Dst:
		// Records below the old mirror's first are not its copies (a
		// mirror that started later than the topic): no source offset
		// is known for them, and the next mirrored one would skip some.
		gp.Reason = fmt.Sprintf("offset %d is below the first record the old mirror wrote (offset %d): no source offset is known for it",
			gp.Kept, pp.Translation[0].Dst)
	default:
		// pp.Translation maps source -> destination; a position on the
		// destination maps back through the inverse, which is exact below
		// the last mirrored position (every record there is one copy).
		gp.SourceOffset = translate(swapped(pp.Translation), gp.Kept, pp.DestinationOffset, pp.SourceOffset)
	}
	return gp
}
