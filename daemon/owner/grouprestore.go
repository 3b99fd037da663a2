package owner

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// Group positions given back after a truncation (issue 21, section 4).
// add --truncate deletes a destination topic, and Kafka its groups'
// commits with it; the leader kept each as a source offset in raft
// (State.GroupRestores, truncate.GroupPositions). The member that mirrors
// the rebuilt partition commits it like a source group's commit: through
// the translation, only for a group without members, never backwards, and
// capped at what is mirrored so far. It yields to a source group of the
// same name that committed on the partition (the other side's position,
// where consumers ran after the failover), and is cleared once committed
// or overtaken.

// restore syncs the kept positions of keys' partitions and returns their
// rows (api.GroupStatus.Restore); those of groups in unread wait for a
// round that read the group's source commits.
func (g *GroupSync) restore(ctx context.Context, mirror string, keys []fetch.Key, onDest map[string]kwire.GroupListing,
	fromSource map[groupRowKey]bool, unread map[string]bool, tr translator) []api.GroupStatus {
	held := map[fetch.Key]bool{}
	for _, k := range keys {
		held[k] = true
	}
	byGroup := map[string]map[kafka.TopicPartition]kafka.Committed{}
	kept := map[groupRowKey]raftstore.GroupRestore{}
	done := map[fetch.Key][]raftstore.GroupRestore{}
	leases := map[fetch.Key]raftstore.Lease{}
	g.store.Read(func(s *raftstore.State) {
		for tk, rs := range s.GroupRestores {
			m, topic, ok := strings.Cut(tk, "/")
			if !ok || m != mirror {
				continue
			}
			for _, r := range rs {
				fk := fetch.Key{Mirror: mirror, Topic: topic, Partition: r.Partition}
				p, ok := s.Partition(raftstore.PartitionKey{Mirror: mirror, Topic: topic, Partition: r.Partition})
				if !held[fk] || !ok || p.Owner != g.nodeID || unread[r.Group] {
					continue
				}
				leases[fk] = raftstore.Lease{Owner: p.Owner, Generation: p.Generation}
				rk := groupRowKey{mirror, r.Group, topic, r.Partition}
				if fromSource[rk] {
					done[fk] = append(done[fk], r)
					continue
				}
				if byGroup[r.Group] == nil {
					byGroup[r.Group] = map[kafka.TopicPartition]kafka.Committed{}
				}
				byGroup[r.Group][kafka.TopicPartition{Topic: topic, Partition: r.Partition}] = kafka.Committed{Offset: r.SourceOffset, Metadata: r.Metadata}
				kept[rk] = r
			}
		}
	})
	groups := make([]string, 0, len(byGroup))
	for group := range byGroup {
		groups = append(groups, group)
	}
	sort.Strings(groups)
	var rows []api.GroupStatus
	for _, group := range groups {
		dg, exists := onDest[group]
		for _, r := range g.syncGroup(ctx, consumerGroups, mirror, group, dg, exists, byGroup[group], tr) {
			k := kept[rowKeyOf(r)]
			r.Restore = true
			note := fmt.Sprintf("position %d on the topic add --truncate deleted, given back", k.DestinationCommitted)
			if r.Reason != "" {
				note += "; " + r.Reason
			}
			r.Reason = note
			if (r.State == api.GroupSynced && r.DestinationCommitted >= 0) || r.Ahead {
				// Committed, or the group committed past it since.
				fk := fetch.Key{Mirror: mirror, Topic: r.Topic, Partition: r.Partition}
				done[fk] = append(done[fk], k)
			}
			rows = append(rows, r)
		}
	}
	for k, rs := range done {
		err := g.submit(ctx, raftstore.ClearGroupRestores{Key: raftstore.PartitionKey{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition},
			Lease: leases[k], Done: rs})
		if err != nil {
			// A lease that moved on: its new owner clears them.
			g.warn(mirror+"/restore", "given-back group positions not cleared; tried again next round", err)
			continue
		}
		g.log.Info("consumer group positions kept across a truncation given back", zap.Stringer("partition", k), zap.Int("positions", len(rs)))
	}
	return rows
}
