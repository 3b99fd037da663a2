package ops

import (
	"context"
	"fmt"
	"sort"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
	"go.uber.org/zap"
)

// DescribeGroups shows the group offset sync of every member: each member
// reports the partitions it syncs. A member that does not answer within a
// few seconds is left out.
func (o *Ops) DescribeGroups(ctx context.Context, mirror string) ([]api.GroupStatus, error) {
	if err := o.member.CaughtUp(ctx); err != nil {
		return nil, err
	}
	found := mirror == ""
	owners := map[fetch.Key]string{}
	o.store.Read(func(s *raftstore.State) {
		_, ok := s.Mirrors[mirror]
		found = found || ok
		for _, t := range s.Topics {
			for i, p := range t.Partitions {
				owners[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}] = p.Owner
			}
		}
	})
	if !found {
		return nil, fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, mirror)
	}
	all, silent := o.member.GroupRows(ctx)
	if len(silent) > 0 {
		o.log.Debug("members did not report their group sync", zap.Strings("members", sortedKeys(silent)))
	}
	// A partition that just moved may be reported by its old and new
	// member: the one that owns it now wins.
	best := map[groupRow]api.GroupStatus{}
	for _, r := range all {
		if mirror != "" && r.Mirror != mirror {
			continue
		}
		k := groupRow{r.Mirror, r.Group, r.Topic, r.Partition}
		old, ok := best[k]
		owner := owners[fetch.Key{Mirror: r.Mirror, Topic: r.Topic, Partition: r.Partition}]
		if !ok || (old.Member != owner && r.Member == owner) {
			best[k] = r
		}
	}
	out := make([]api.GroupStatus, 0, len(best))
	for _, r := range best {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Mirror != b.Mirror {
			return a.Mirror < b.Mirror
		}
		if a.Group != b.Group {
			return a.Group < b.Group
		}
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		return a.Partition < b.Partition
	})
	return out, nil
}

// groupRow identifies a row of DescribeGroups.
type groupRow struct {
	Mirror, Group, Topic string
	Partition            int32
}
