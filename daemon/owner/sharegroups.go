package owner

import (
	"context"
	"fmt"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Share groups (KIP-932, issue 21 section 5). A share group's position on
// a partition is its share-partition start offset (SPSO): every record
// below it is acknowledged or archived; records at or above it may be
// in flight, acknowledged or not yet delivered, which an offset cannot
// say. kmirror carries the SPSO, translated exactly like a consumer
// group's commit (the first mirrored record at or after it), with
// AlterShareGroupOffsets while the group has no members on the
// destination, never backwards. A consumer of the group on the
// destination may therefore see again records the source had
// acknowledged above the SPSO (share groups redeliver; nothing is lost).

// syncShareGroup syncs one share group's SPSOs of parts and returns a row
// per partition the group has state for.
func (g *GroupSync) syncShareGroup(ctx context.Context, mirror string, src *kafka.Admin, group string, dg kwire.GroupListing, exists bool,
	parts []kafka.TopicPartition, tr translator) []api.GroupStatus {
	spso, err := src.ShareGroupOffsets(ctx, group, parts)
	if err != nil {
		g.warn(mirror+"/"+group, "share group offsets of a source group not readable; retrying next round", err)
		return g.pendingRows(func(k groupRowKey) bool { return k.Mirror == mirror && k.Group == group },
			"source share group offsets not readable: "+err.Error())
	}
	if len(spso) == 0 {
		return nil
	}
	committed := make(map[kafka.TopicPartition]kafka.Committed, len(spso))
	for tp, o := range spso {
		committed[tp] = kafka.Committed{Offset: o}
	}
	return g.syncGroup(ctx, shareGroups, mirror, group, dg, exists, committed, tr)
}

// shareGroups syncs start offsets (DescribeShareGroupOffsets,
// AlterShareGroupOffsets; the coordinator refuses a group with members).
var shareGroups = groupKind{kind: "share", noun: "start offset", tool: "kafka-share-groups.sh",
	read: func(ctx context.Context, dest *kafka.Admin, group string, tps []kafka.TopicPartition) (map[kafka.TopicPartition]int64, error) {
		return dest.ShareGroupOffsets(ctx, group, tps)
	},
	write: func(ctx context.Context, dest *kafka.Admin, group string, pos map[kafka.TopicPartition]kafka.Committed) (map[kafka.TopicPartition]error, error) {
		offsets := make(map[kafka.TopicPartition]int64, len(pos))
		for tp, c := range pos {
			offsets[tp] = c.Offset
		}
		return dest.AlterShareGroupOffsets(ctx, group, offsets)
	},
	conflict: func(group string, dg kwire.GroupListing, exists bool) string {
		if !exists || dg.Type == "share" {
			return ""
		}
		kind := dg.Type
		if kind == "" {
			kind = "protocol type " + dg.ProtocolType
		}
		return fmt.Sprintf("a group named %s exists on the destination as a %s group, not a share group (a group-name conflict, KIP-1279): "+
			"kmirror leaves it alone; rename or delete one of them, or exclude the group with %s (kmirror alter)", group, kind, mirrorprops.PropGroupsExclude)
	},
	unsupported: func(err error) string {
		if !kafka.IsNoShareGroups(err) {
			return ""
		}
		return "the destination cluster has no share groups (AlterShareGroupOffsets needs Kafka 4.2 or newer): kmirror cannot carry " +
			"this share group's position; its consumers start on the destination from share.auto.offset.reset"
	},
}
