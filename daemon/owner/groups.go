package owner

import (
	"context"
	"maps"
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

// adminTimeout bounds each sync's calls to a Kafka cluster.
const adminTimeout = 15 * time.Second

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

// GroupSync is a member's group offset syncer.
type GroupSync struct {
	ctx      context.Context
	nodeID   string
	clientID string // the member's Kafka client.id, for source admin clients
	store    Store
	dest     *kafka.Admin
	engine   func() *fetch.Engine
	log      *zap.Logger
	// submit applies a command through the raft leader (Member.Submit).
	submit func(ctx context.Context, cmd raftstore.Command) error

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

func newGroupSync(o *Owner) *GroupSync {
	return &GroupSync{ctx: o.ctx, nodeID: o.cfg.NodeID, clientID: o.cfg.ClientID, store: o.store, dest: o.dest,
		engine: func() *fetch.Engine { return o.engine }, log: o.log, submit: o.member.Submit, rows: map[groupRowKey]api.GroupStatus{}, final: map[groupRowKey]api.GroupStatus{},
		since: map[groupRowKey]seenCommit{}, conflicts: map[string]int64{}, sources: map[string]*groupSource{},
		due: map[string]time.Time{}, warned: map[string]string{}}
}

// loop syncs each mirror's groups every groups.sync.interval until the
// member stops.
func (g *GroupSync) run() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	defer g.closeSources(nil)
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		mirrors := g.mirrors()
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
			ctx, cancel := context.WithTimeout(g.ctx, adminTimeout)
			g.syncMirror(ctx, mir, settings)
			cancel()
		}
	}
}

// closeSources closes the source connections of mirrors no longer in keep
// (all of them for nil).
func (g *GroupSync) closeSources(keep map[string]raftstore.Mirror) {
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
func (g *GroupSync) warn(key, msg string, err error) {
	g.mu.Lock()
	same := g.warned[key] == err.Error()
	g.warned[key] = err.Error()
	g.mu.Unlock()
	if !same {
		g.log.Warn(msg, zap.String("mirror", key), zap.Error(err))
	}
}

// source returns the admin connection to a mirror's source cluster.
func (g *GroupSync) source(mir raftstore.Mirror) *kafka.Admin {
	g.mu.Lock()
	defer g.mu.Unlock()
	bs := mirrorprops.SourceKey(mir)
	if src, ok := g.sources[mir.Name]; ok && src.key == bs {
		return src.admin
	} else if ok {
		src.admin.Close()
	}
	a := mirrorprops.SourceAdmin(mir, g.clientID)
	g.sources[mir.Name] = &groupSource{admin: a, key: bs}
	return a
}

// LiveRows returns the rows of the partitions this member syncs now
// (not the final rows of stopped ones), for /metrics.
func (g *GroupSync) LiveRows() []api.GroupStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	out := make([]api.GroupStatus, 0, len(g.rows))
	for k, r := range g.rows {
		if s, ok := g.since[k]; ok && r.State != api.GroupSynced && !r.Ahead {
			r.SyncLagMs = now.Sub(s.at).Milliseconds()
		}
		out = append(out, r)
	}
	return out
}

// LocalRows returns this member's rows.
func (g *GroupSync) LocalRows() []api.GroupStatus {
	out := g.LiveRows()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range g.final {
		out = append(out, r)
	}
	return out
}

// ConflictCounts returns the conflicts counted per mirror.
func (g *GroupSync) ConflictCounts() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.conflicts)
}

// mirrors copies every mirror of the replicated state.
func (g *GroupSync) mirrors() map[string]raftstore.Mirror {
	mirrors := map[string]raftstore.Mirror{}
	g.store.Read(func(s *raftstore.State) {
		for n, mir := range s.Mirrors {
			mirrors[n] = *mir.Clone()
		}
	})
	return mirrors
}
