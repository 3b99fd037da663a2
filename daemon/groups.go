package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// Consumer group offset sync (design.md section 6). Each member syncs the
// partitions it mirrors, since it holds their translation in memory: for
// every source group the mirror includes, it reads the committed offsets
// of those partitions, translates them exactly (Engine.TranslateCommitted)
// and commits them on the destination, only for groups without members
// there and never backwards.

type groupRowKey struct {
	Mirror, Group, Topic string
	Partition            int32
}

func rowKeyOf(g api.GroupStatus) groupRowKey {
	return groupRowKey{g.Mirror, g.Group, g.Topic, g.Partition}
}

// translator maps a committed source offset to the destination offset to
// commit (Engine.TranslateCommitted's contract).
type translator func(k fetch.Key, sourceOffset int64) (d int64, capped bool, err error)

// groupSync is a member's group offset syncer.
type groupSync struct {
	m *Member

	mu   sync.Mutex
	rows map[groupRowKey]api.GroupStatus
	// final holds the rows of the last sync of partitions that stopped
	// (remove), shown until their topic is added again or deleted.
	final map[groupRowKey]api.GroupStatus
	// since is when each row's current source commit was first seen
	// without being synced, for SyncLagMs.
	since     map[groupRowKey]seenCommit
	conflicts map[string]int64 // per mirror: rows that went into conflict
	sources   map[string]*groupSource
	due       map[string]time.Time
	warned    map[string]string // per mirror (or mirror/group): the last error logged
}

type seenCommit struct {
	offset int64
	at     time.Time
}

type groupSource struct {
	admin *kafka.Admin
	key   string // sourceKey the admin was made for
}

func newGroupSync(m *Member) *groupSync {
	return &groupSync{m: m, rows: map[groupRowKey]api.GroupStatus{}, final: map[groupRowKey]api.GroupStatus{},
		since: map[groupRowKey]seenCommit{}, conflicts: map[string]int64{}, sources: map[string]*groupSource{},
		due: map[string]time.Time{}, warned: map[string]string{}}
}

// loop syncs each mirror's groups every groups.sync.interval until the
// member stops.
func (g *groupSync) loop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	defer g.closeSources(nil)
	for {
		select {
		case <-g.m.ctx.Done():
			return
		case <-t.C:
		}
		mirrors := g.m.mirrorsSnapshot()
		g.closeSources(mirrors)
		names := make([]string, 0, len(mirrors))
		for n := range mirrors {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			mir := mirrors[n]
			settings, err := parseMirrorSettings(mir.Name, mir.Properties)
			if err != nil {
				g.warn(n, "mirror properties cannot be used for group sync", err)
				continue
			}
			if time.Now().Before(g.due[n]) {
				continue
			}
			g.due[n] = time.Now().Add(settings.GroupSyncInterval)
			ctx, cancel := context.WithTimeout(g.m.ctx, adminTimeout)
			g.syncMirror(ctx, mir, settings)
			cancel()
		}
	}
}

// closeSources closes the source connections of mirrors no longer in keep
// (all of them for nil).
func (g *groupSync) closeSources(keep map[string]raftstore.Mirror) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for n, src := range g.sources {
		if _, ok := keep[n]; !ok {
			src.admin.Close()
			delete(g.sources, n)
		}
	}
	for k := range g.final {
		if _, ok := keep[k.Mirror]; !ok {
			delete(g.final, k)
		}
	}
}

// warn logs err once per key (a mirror, or mirror/group) until it changes.
func (g *groupSync) warn(key, msg string, err error) {
	g.mu.Lock()
	same := g.warned[key] == err.Error()
	g.warned[key] = err.Error()
	g.mu.Unlock()
	if !same {
		g.m.log.Warn(msg, zap.String("mirror", key), zap.Error(err))
	}
}

// source returns the admin connection to a mirror's source cluster.
func (g *groupSync) source(mir raftstore.Mirror) *kafka.Admin {
	g.mu.Lock()
	defer g.mu.Unlock()
	bs := sourceKey(mir)
	if src, ok := g.sources[mir.Name]; ok && src.key == bs {
		return src.admin
	} else if ok {
		src.admin.Close()
	}
	a := g.m.newSourceAdmin(mir)
	g.sources[mir.Name] = &groupSource{admin: a, key: bs}
	return a
}

// syncMirror syncs the groups of the partitions of one mirror that this
// member mirrors now, and replaces the mirror's rows with the outcome.
func (g *groupSync) syncMirror(ctx context.Context, mir raftstore.Mirror, settings mirrorSettings) {
	var keys []fetch.Key
	for _, st := range g.m.engine.Statuses() {
		if st.Key.Mirror == mir.Name && st.State == fetch.Mirroring {
			keys = append(keys, st.Key)
		}
	}
	var rows []api.GroupStatus
	var err error
	if len(keys) > 0 {
		rows, err = g.sync(ctx, mir, settings, keys, g.m.engine.TranslateCommitted)
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
func (g *groupSync) pendingRows(match func(groupRowKey) bool, why string) []api.GroupStatus {
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
func (g *groupSync) replaceRows(mirror string, rows []api.GroupStatus, final bool) {
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
		if r.State == api.GroupSynced {
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
func (g *groupSync) sync(ctx context.Context, mir raftstore.Mirror, settings mirrorSettings, keys []fetch.Key, tr translator) ([]api.GroupStatus, error) {
	started := time.Now().UnixMilli()
	src := g.source(mir)
	srcGroups, err := src.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	dstGroups, err := g.m.dest.ListGroups(ctx)
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
	for _, sg := range srcGroups {
		if seen[sg.ID] || !settings.syncsGroup(sg.ID) {
			continue
		}
		seen[sg.ID] = true
		committed, err := src.CommittedOffsets(ctx, sg.ID, parts)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			// One group's failure (a missing ACL, a coordinator moving)
			// must not hold up the others: its rows wait for the next round.
			g.warn(mir.Name+"/"+sg.ID, "committed offsets of a source group not readable; retrying next round", err)
			rows = append(rows, g.pendingRows(func(k groupRowKey) bool { return k.Mirror == mir.Name && k.Group == sg.ID },
				"source committed offsets not readable: "+err.Error())...)
			continue
		}
		if len(committed) == 0 {
			continue
		}
		dg, exists := onDest[sg.ID]
		rows = append(rows, g.syncGroup(ctx, mir.Name, sg.ID, dg, exists, committed, tr)...)
	}
	for i := range rows {
		rows[i].SyncedAtMs = started
	}
	return rows, nil
}

// syncGroup syncs one group; committed holds its source commits.
func (g *groupSync) syncGroup(ctx context.Context, mirror, group string, dg kwire.GroupListing, exists bool,
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
		rows[i] = api.GroupStatus{Mirror: mirror, Group: group, Topic: tp.Topic, Partition: tp.Partition,
			SourceCommitted: committed[tp].Offset, DestinationCommitted: -1, Member: g.m.cfg.NodeID}
	}
	setAll := func(state, reason string) []api.GroupStatus {
		for i := range rows {
			rows[i].State, rows[i].Reason = state, reason
		}
		return rows
	}
	if reason := groupNameConflict(group, dg, exists); reason != "" {
		return setAll(api.GroupConflict, reason)
	}
	dst, err := g.m.dest.CommittedOffsets(ctx, group, tps)
	if err != nil {
		return setAll(api.GroupPending, "destination committed offsets unknown: "+err.Error())
	}
	for i, tp := range tps {
		if c, ok := dst[tp]; ok {
			rows[i].DestinationCommitted = c.Offset
		}
	}
	if exists && dg.State != "Empty" {
		return setAll(api.GroupConflict, fmt.Sprintf("group %s has members on the destination (state %s): kmirror commits only for a group "+
			"nobody uses there, so it leaves this one alone; stop its consumers on the destination until failover, or exclude the group "+
			"with %s (kmirror alter)", group, dg.State, propGroupsExclude))
	}
	commit := map[kafka.TopicPartition]kafka.Committed{}
	target := make([]int64, len(tps))
	for i, tp := range tps {
		r := &rows[i]
		k := fetch.Key{Mirror: mirror, Topic: tp.Topic, Partition: tp.Partition}
		d, capped, err := tr(k, r.SourceCommitted)
		var before *fetch.BeforeStartError
		switch {
		case errors.As(err, &before):
			r.State, r.Reason = api.GroupPending, err.Error()+"; kmirror commits nothing for it: set the destination offset yourself "+
				"(kafka-consumer-groups.sh --reset-offsets) if skipping them is right"
			continue
		case err != nil:
			r.State, r.Reason = api.GroupPending, "no translation: "+err.Error()
			continue
		}
		target[i] = d
		switch {
		case r.DestinationCommitted > d:
			r.State, r.Reason = api.GroupConflict, fmt.Sprintf("the destination's committed offset %d is ahead of %d, the translation of the source's %d: "+
				"kmirror never moves a committed offset backwards; if the source group was reset on purpose, reset the destination group "+
				"too (kafka-consumer-groups.sh --reset-offsets --to-offset %d) or delete it there", r.DestinationCommitted, d, r.SourceCommitted, d)
		case r.DestinationCommitted < d:
			commit[tp] = kafka.Committed{Offset: d, Metadata: committed[tp].Metadata}
			fallthrough
		default:
			r.State = api.GroupSynced
			if capped {
				r.State, r.Reason = api.GroupPending, fmt.Sprintf("the source commit is past what is mirrored so far: committed the destination end %d; "+
					"it follows as mirroring catches up", d)
			}
		}
	}
	if len(commit) == 0 {
		return rows
	}
	refused, err := g.m.dest.CommitOffsets(ctx, group, commit)
	for i, tp := range tps {
		if _, ok := commit[tp]; !ok {
			continue
		}
		r := &rows[i]
		rerr := err
		if rerr == nil {
			rerr = refused[tp]
		}
		switch {
		case rerr == nil:
			r.DestinationCommitted = target[i]
		case kafka.IsGroupInUse(rerr):
			r.State, r.Reason = api.GroupConflict, fmt.Sprintf("group %s got members on the destination (the commit was refused: %v): "+
				"kmirror leaves a group in use alone", group, rerr)
		default:
			r.State, r.Reason = api.GroupPending, "commit failed, retrying: "+rerr.Error()
		}
	}
	return rows
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
		"KIP-1279): kmirror leaves it alone; rename or delete one of them, or exclude the group with %s (kmirror alter)", group, kind, propGroupsExclude)
}

// finalSync syncs the groups of a partition that has just stopped (remove),
// from the translation of its final checkpoint. It is best effort: a source
// that is gone (emergency failover) leaves the last periodic sync.
func (g *groupSync) finalSync(ctx context.Context, spec fetch.Spec) {
	k := spec.Key
	var mir raftstore.Mirror
	found := false
	g.m.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[k.Mirror]; ok {
			mir, found = *m.Clone(), true
		}
	})
	if !found {
		return
	}
	settings, err := parseMirrorSettings(mir.Name, mir.Properties)
	if err != nil {
		return
	}
	xl, err := g.m.engine.StoppedTranslation(ctx, spec)
	if err != nil {
		g.m.log.Warn("final group sync skipped: translation not readable", zap.Stringer("partition", k), zap.Error(err))
		return
	}
	rows, err := g.sync(ctx, mir, settings, []fetch.Key{k}, xl)
	if err != nil {
		g.m.log.Warn("final group sync failed: the destination keeps the last periodic sync", zap.Stringer("partition", k), zap.Error(err))
		g.freeze(k, "final sync at the stop failed (the destination keeps the last periodic sync): "+err.Error())
		return
	}
	g.replaceRows(k.Mirror, rows, true)
	g.m.log.Info("final group sync done", zap.Stringer("partition", k), zap.Int("groups", len(rows)))
}

// freeze keeps the rows of a stopped partition whose final sync failed
// (a source gone at failover) as its final rows, with why.
func (g *groupSync) freeze(k fetch.Key, why string) {
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

// liveRows returns the rows of the partitions this member syncs now
// (not the final rows of stopped ones), for /metrics.
func (g *groupSync) liveRows() []api.GroupStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	out := make([]api.GroupStatus, 0, len(g.rows))
	for k, r := range g.rows {
		if s, ok := g.since[k]; ok && r.State != api.GroupSynced {
			r.SyncLagMs = now.Sub(s.at).Milliseconds()
		}
		out = append(out, r)
	}
	return out
}

// localRows returns this member's rows.
func (g *groupSync) localRows() []api.GroupStatus {
	out := g.liveRows()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.final {
		out = append(out, r)
	}
	return out
}

// conflictCounts returns the conflicts counted per mirror.
func (g *groupSync) conflictCounts() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]int64, len(g.conflicts))
	for k, v := range g.conflicts {
		out[k] = v
	}
	return out
}

// LocalGroupRows serves /v1/internal/groups.
func (m *Member) LocalGroupRows() []api.GroupStatus { return m.groups.localRows() }

// DescribeGroups shows the group offset sync of every member: each member
// reports the partitions it syncs. A member that does not answer within a
// few seconds is left out.
func (m *Member) DescribeGroups(ctx context.Context, mirror string) ([]api.GroupStatus, error) {
	if err := m.caughtUp(ctx); err != nil {
		return nil, err
	}
	found := mirror == ""
	owners := map[fetch.Key]string{}
	m.store.Read(func(s *raftstore.State) {
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
	all := m.groups.localRows()
	answers, silent := askOthers(ctx, m, 3*time.Second, (*api.Client).InternalGroups)
	for _, rows := range answers {
		all = append(all, rows...)
	}
	if len(silent) > 0 {
		m.log.Debug("members did not report their group sync", zap.Strings("members", sortedKeys(silent)))
	}
	// A partition that just moved may be reported by its old and new
	// member: the one that owns it now wins.
	best := map[groupRowKey]api.GroupStatus{}
	for _, r := range all {
		if mirror != "" && r.Mirror != mirror {
			continue
		}
		k := rowKeyOf(r)
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
