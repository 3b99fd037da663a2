package daemon

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
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
			settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
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
	bs := mirrorprops.SourceKey(mir)
	if src, ok := g.sources[mir.Name]; ok && src.key == bs {
		return src.admin
	} else if ok {
		src.admin.Close()
	}
	a := g.m.SourceAdmin(mir)
	g.sources[mir.Name] = &groupSource{admin: a, key: bs}
	return a
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
	if err := m.CaughtUp(ctx); err != nil {
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
