package owner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// One sync round of consumer group offsets for a mirror: read the source
// groups' commits, translate them exactly, commit them on the destination
// for groups without members there, never backwards (groups.go has the
// syncer's loop and its rows).

// syncMirror syncs the groups of the partitions of one mirror that this
// member mirrors now, and replaces the mirror's rows with the outcome.
func (g *GroupSync) syncMirror(ctx context.Context, mir raftstore.Mirror, settings mirrorprops.Settings) {
	var keys []fetch.Key
	for _, st := range g.engine().Statuses() {
		if st.Key.Mirror == mir.Name && st.State == fetch.Mirroring {
			keys = append(keys, st.Key)
		}
	}
	var rows []api.GroupStatus
	var err error
	if len(keys) > 0 {
		rows, err = g.sync(ctx, mir, settings, keys, g.engine().TranslateCommitted)
	}
	if err != nil {
		g.warn(mir.Name, "group offset sync failed; retrying", err)
		held := map[fetch.Key]bool{}
		for _, k := range keys {
			held[k] = true
		}
		rows = g.pendingRows(func(k groupRowKey) bool {
			return k.Mirror == mir.Name && held[fetch.Key{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition}]
		}, "not refreshed: "+err.Error())
	} else {
		g.mu.Lock()
		delete(g.warned, mir.Name)
		g.mu.Unlock()
	}
	g.replaceRows(mir.Name, rows, false)
}

// pendingRows keeps the last rows that match as pending, with why they
// could not be refreshed.
func (g *GroupSync) pendingRows(match func(groupRowKey) bool, why string) []api.GroupStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []api.GroupStatus
	for k, r := range g.rows {
		if match(k) {
			r.State, r.Reason = api.GroupPending, why
			out = append(out, r)
		}
	}
	return out
}

// replaceRows installs the rows of one sync: all rows of the mirror (a
// periodic sync) or, with final, rows of stopped partitions.
func (g *GroupSync) replaceRows(mirror string, rows []api.GroupStatus, final bool) {
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	fresh := map[groupRowKey]bool{}
	for _, r := range rows {
		k := rowKeyOf(r)
		fresh[k] = true
		old, had := g.rows[k]
		if r.State == api.GroupConflict && (!had || old.State != api.GroupConflict) {
			g.conflicts[mirror]++
		}
		if r.State == api.GroupSynced || r.Ahead {
			// Ahead: the destination holds more than the source
			// committed; nothing is waiting to be synced.
			delete(g.since, k)
		} else if s, ok := g.since[k]; !ok || s.offset != r.SourceCommitted {
			g.since[k] = seenCommit{offset: r.SourceCommitted, at: now}
		}
		if s, ok := g.since[k]; ok {
			r.SyncLagMs = now.Sub(s.at).Milliseconds()
		}
		if final {
			g.final[k] = r
			delete(g.rows, k)
			continue
		}
		g.rows[k] = r
		delete(g.final, k)
	}
	if final {
		return
	}
	for k := range g.rows {
		if k.Mirror == mirror && !fresh[k] {
			delete(g.rows, k)
			delete(g.since, k)
		}
	}
}

// sync syncs every included group's committed offsets of keys and returns
// a row per (group, partition) the source group has committed.
func (g *GroupSync) sync(ctx context.Context, mir raftstore.Mirror, settings mirrorprops.Settings, keys []fetch.Key, tr translator) ([]api.GroupStatus, error) {
	started := time.Now().UnixMilli()
	src := g.source(mir)
	srcGroups, err := src.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	dstGroups, err := g.dest.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	onDest := map[string]kwire.GroupListing{}
	for _, dg := range dstGroups {
		onDest[dg.ID] = dg
	}
	parts := make([]kafka.TopicPartition, len(keys))
	for i, k := range keys {
		parts[i] = kafka.TopicPartition{Topic: k.Topic, Partition: k.Partition}
	}
	var rows []api.GroupStatus
	seen := map[string]bool{}
	// fromSource: the (group, partition) rows a source group's commit
	// governs; a position kept by a truncation yields to it. unread: the
	// groups whose source commits could not be read this round, whose kept
	// positions wait (the source may hold one that must win).
	fromSource, unread := map[groupRowKey]bool{}, map[string]bool{}
	for _, sg := range srcGroups {
		if seen[sg.ID] || !settings.SyncsGroup(sg.ID) {
			continue
		}
		seen[sg.ID] = true
		if sg.Type == "share" {
			dg, exists := onDest[sg.ID]
			rows = append(rows, g.syncShareGroup(ctx, mir.Name, src, sg.ID, dg, exists, parts, tr)...)
			continue
		}
		committed, err := src.CommittedOffsets(ctx, sg.ID, parts)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			// One group's failure (a missing ACL, a coordinator moving)
			// must not hold up the others: its rows wait for the next round.
			unread[sg.ID] = true
			g.warn(mir.Name+"/"+sg.ID, "committed offsets of a source group not readable; retrying next round", err)
			rows = append(rows, g.pendingRows(func(k groupRowKey) bool { return k.Mirror == mir.Name && k.Group == sg.ID },
				"source committed offsets not readable: "+err.Error())...)
			continue
		}
		if len(committed) == 0 {
			continue
		}
		for tp := range committed {
			fromSource[groupRowKey{mir.Name, sg.ID, tp.Topic, tp.Partition}] = true
		}
		dg, exists := onDest[sg.ID]
		rows = append(rows, g.syncGroup(ctx, consumerGroups, mir.Name, sg.ID, dg, exists, committed, tr)...)
	}
	rows = append(rows, g.restore(ctx, mir.Name, keys, onDest, fromSource, unread, tr)...)
	for i := range rows {
		rows[i].SyncedAtMs = started
	}
	return rows, nil
}

// syncGroup syncs one group of kind gk; committed holds its source
// positions (commits, or a share group's start offsets).
func (g *GroupSync) syncGroup(ctx context.Context, gk groupKind, mirror, group string, dg kwire.GroupListing, exists bool,
	committed map[kafka.TopicPartition]kafka.Committed, tr translator) []api.GroupStatus {
	tps := make([]kafka.TopicPartition, 0, len(committed))
	for tp := range committed {
		tps = append(tps, tp)
	}
	sort.Slice(tps, func(i, j int) bool {
		return tps[i].Topic < tps[j].Topic || (tps[i].Topic == tps[j].Topic && tps[i].Partition < tps[j].Partition)
	})
	rows := make([]api.GroupStatus, len(tps))
	for i, tp := range tps {
		rows[i] = api.GroupStatus{Mirror: mirror, Group: group, Kind: gk.kind, Topic: tp.Topic, Partition: tp.Partition,
			SourceCommitted: committed[tp].Offset, DestinationCommitted: -1, Member: g.nodeID}
	}
	setAll := func(state, reason string) []api.GroupStatus {
		for i := range rows {
			rows[i].State, rows[i].Reason = state, reason
		}
		return rows
	}
	if reason := gk.conflict(group, dg, exists); reason != "" {
		return setAll(api.GroupConflict, reason)
	}
	dst, err := gk.read(ctx, g.dest, group, tps)
	if why := gk.unsupported(err); why != "" {
		for i := range rows {
			rows[i].Unsupported = true
		}
		return setAll(api.GroupConflict, why)
	}
	if err != nil {
		return setAll(api.GroupPending, "destination "+gk.noun+"s unknown: "+err.Error())
	}
	for i, tp := range tps {
		if o, ok := dst[tp]; ok {
			rows[i].DestinationCommitted = o
		}
	}
	if exists && dg.State != "Empty" {
		return setAll(api.GroupConflict, fmt.Sprintf("group %s has members on the destination (state %s): kmirror commits only for a group "+
			"nobody uses there, so it leaves this one alone; stop its consumers on the destination until failover, or exclude the group "+
			"with %s (kmirror alter)", group, dg.State, mirrorprops.PropGroupsExclude))
	}
	commit := map[kafka.TopicPartition]kafka.Committed{}
	for i, tp := range tps {
		r := &rows[i]
		k := fetch.Key{Mirror: mirror, Topic: tp.Topic, Partition: tp.Partition}
		d, capped, err := tr(k, r.SourceCommitted)
		var before *fetch.BeforeStartError
		var floor *fetch.BelowFloorError
		switch {
		case errors.As(err, &before):
			r.State, r.Reason = api.GroupPending, err.Error()+"; kmirror commits nothing for it: set the destination offset yourself "+
				"("+gk.tool+" --reset-offsets) if skipping them is right"
			continue
		case errors.As(err, &floor):
			r.State, r.Reason = api.GroupPending, err.Error()+"; kmirror commits nothing for it until the group commits at or above "+
				fmt.Sprint(floor.Floor)+", or set the destination offset yourself ("+gk.tool+" --reset-offsets)"
			continue
		case err != nil:
			r.State, r.Reason = api.GroupPending, "no translation: "+err.Error()
			continue
		}
		switch {
		case r.DestinationCommitted > d:
			r.State, r.Ahead, r.Reason = api.GroupConflict, true, fmt.Sprintf("the destination's %s %d is ahead of %d, the translation of the source's %d: "+
				"kmirror never moves a %s backwards; if the source group was reset on purpose, reset the destination group "+
				"too (%s --reset-offsets --to-offset %d) or delete it there", gk.noun, r.DestinationCommitted, d, r.SourceCommitted, gk.noun, gk.tool, d)
		case r.DestinationCommitted < d:
			commit[tp] = kafka.Committed{Offset: d, Metadata: committed[tp].Metadata}
			fallthrough
		default:
			r.State = api.GroupSynced
			if capped {
				r.State, r.Reason = api.GroupPending, fmt.Sprintf("the source's %s is past what is mirrored so far: committed the destination end %d; "+
					"it follows as mirroring catches up", gk.noun, d)
			}
		}
	}
	if len(commit) == 0 {
		return rows
	}
	refused, err := gk.write(ctx, g.dest, group, commit)
	for i, tp := range tps {
		c, ok := commit[tp]
		if !ok {
			continue
		}
		r := &rows[i]
		rerr := err
		if rerr == nil {
			rerr = refused[tp]
		}
		switch {
		case rerr == nil:
			r.DestinationCommitted = c.Offset
		case kafka.IsGroupInUse(rerr):
			r.State, r.Reason = api.GroupConflict, fmt.Sprintf("group %s got members on the destination (the commit was refused: %v): "+
				"kmirror leaves a group in use alone", group, rerr)
		default:
			r.State, r.Reason = api.GroupPending, "commit failed, retrying: "+rerr.Error()
		}
	}
	return rows
}

// groupKind is what a consumer group and a share group sync differently:
// the name of their position, how the destination's positions are read
// and written, and when a same-named destination group is not one
// kmirror may write.
type groupKind struct {
	kind  string // api.GroupStatus.Kind
	noun  string // "committed offset", "start offset"
	tool  string // the Kafka tool that resets the position by hand
	read  func(ctx context.Context, dest *kafka.Admin, group string, tps []kafka.TopicPartition) (map[kafka.TopicPartition]int64, error)
	write func(ctx context.Context, dest *kafka.Admin, group string, pos map[kafka.TopicPartition]kafka.Committed) (map[kafka.TopicPartition]error, error)
	// conflict says why a same-named destination group is not one
	// kmirror may write ("" when it may).
	conflict func(group string, dg kwire.GroupListing, exists bool) string
	// unsupported says why a read error means the destination cannot take
	// the group at all ("" for an error worth retrying).
	unsupported func(err error) string
}

// consumerGroups syncs committed offsets (OffsetFetch, OffsetCommit).
var consumerGroups = groupKind{noun: "committed offset", tool: "kafka-consumer-groups.sh", conflict: groupNameConflict,
	read: func(ctx context.Context, dest *kafka.Admin, group string, tps []kafka.TopicPartition) (map[kafka.TopicPartition]int64, error) {
		c, err := dest.CommittedOffsets(ctx, group, tps)
		out := make(map[kafka.TopicPartition]int64, len(c))
		for tp, o := range c {
			out[tp] = o.Offset
		}
		return out, err
	},
	write: func(ctx context.Context, dest *kafka.Admin, group string, pos map[kafka.TopicPartition]kafka.Committed) (map[kafka.TopicPartition]error, error) {
		return dest.CommitOffsets(ctx, group, pos)
	},
	unsupported: func(error) string { return "" },
}

// groupNameConflict explains why a destination group of the same name is
// not one kmirror may commit for, or returns "".
func groupNameConflict(group string, dg kwire.GroupListing, exists bool) string {
	if !exists {
		return ""
	}
	kind := dg.Type
	switch {
	case dg.Type == "share" || dg.Type == "streams":
	case dg.ProtocolType != "" && dg.ProtocolType != "consumer":
		kind = "protocol type " + dg.ProtocolType
	default:
		return ""
	}
	return fmt.Sprintf("a group named %s exists on the destination for another purpose (%s), not a consumer group (a group-name conflict, "+
		"KIP-1279): kmirror leaves it alone; rename or delete one of them, or exclude the group with %s (kmirror alter)", group, kind, mirrorprops.PropGroupsExclude)
}

// SkipFinal leaves a stopped partition's groups at the last periodic sync
// without the final one, saying why (the source does not answer: an
// emergency or automatic failover must not wait on it).
func (g *GroupSync) SkipFinal(k fetch.Key, why string) {
	g.log.Warn("final group sync skipped: the destination keeps the last periodic sync", zap.Stringer("partition", k), zap.String("why", why))
	g.freeze(k, "no final sync at the stop ("+why+"): the destination keeps the last periodic sync")
}

// finalSync syncs the groups of a partition that has just stopped (remove),
// from the translation of its final checkpoint. It is best effort: a source
// that is gone (emergency failover) leaves the last periodic sync.
func (g *GroupSync) FinalSync(ctx context.Context, spec fetch.Spec) {
	k := spec.Key
	var mir raftstore.Mirror
	found := false
	g.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[k.Mirror]; ok {
			mir, found = *m.Clone(), true
		}
	})
	if !found {
		return
	}
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return
	}
	xl, err := g.engine().StoppedTranslation(ctx, spec)
	if err != nil {
		g.log.Warn("final group sync skipped: translation not readable", zap.Stringer("partition", k), zap.Error(err))
		return
	}
	rows, err := g.sync(ctx, mir, settings, []fetch.Key{k}, xl)
	if err != nil {
		g.log.Warn("final group sync failed: the destination keeps the last periodic sync", zap.Stringer("partition", k), zap.Error(err))
		g.freeze(k, "final sync at the stop failed (the destination keeps the last periodic sync): "+err.Error())
		return
	}
	g.replaceRows(k.Mirror, rows, true)
	g.log.Info("final group sync done", zap.Stringer("partition", k), zap.Int("groups", len(rows)))
}

// freeze keeps the rows of a stopped partition whose final sync failed
// (a source gone at failover) as its final rows, with why.
func (g *GroupSync) freeze(k fetch.Key, why string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for rk, r := range g.rows {
		if rk.Mirror == k.Mirror && rk.Topic == k.Topic && rk.Partition == k.Partition {
			if r.State != api.GroupSynced {
				r.Reason = why + "; before it: " + r.Reason
			}
			g.final[rk] = r
			delete(g.rows, rk)
			delete(g.since, rk)
		}
	}
}
