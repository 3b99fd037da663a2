package daemon

import (
	"context"
	"errors"
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

// Automatic failover (failover.auto.after.ms, off by default): every member
// probes each mirror's source cluster; the raft leader asks every member
// for its view and, once a majority of the group's members has not reached
// the source for failover.auto.after.ms, stops the mirror's topics as
// remove does, recording why. One member with a bad network is a minority,
// so it never triggers a failover; nor does a leader that cannot ask the
// others, since members that do not answer count as reaching the source.

// sourceProbeInterval is how often a member checks each source cluster;
// sourceProbeTimeout bounds one check.
const (
	sourceProbeInterval = time.Second
	sourceProbeTimeout  = 3 * time.Second
)

// sourceProbe is a member's probe of every mirror's source cluster.
type sourceProbe struct {
	m  *Member
	mu sync.Mutex
	// down is when each mirror's source last went from answering to not
	// answering (absent: it answers); why is the failure.
	down   map[string]time.Time
	why    map[string]string
	admins map[string]*probeAdmin
	// blocked holds mirrors whose source this member pretends not to
	// reach (test hook).
	blocked map[string]bool
}

// probeAdmin is an admin client of a mirror's source, made for the
// connection settings key.
type probeAdmin struct {
	admin *kafka.Admin
	key   string
}

func newSourceProbe(m *Member) *sourceProbe {
	return &sourceProbe{m: m, down: map[string]time.Time{}, why: map[string]string{}, admins: map[string]*probeAdmin{}, blocked: map[string]bool{}}
}

// loop probes the source of every mirror with a topic not STOPPED each
// sourceProbeInterval.
func (p *sourceProbe) loop() {
	t := time.NewTicker(sourceProbeInterval)
	defer t.Stop()
	defer p.closeAdmins(nil)
	for {
		select {
		case <-p.m.ctx.Done():
			return
		case <-t.C:
		}
		// Only mirrors with a topic still mirrored are probed: after a
		// failover the source's absence is no news (and no alert).
		mirrors := p.m.mirrorsSnapshot()
		p.m.store.Read(func(s *raftstore.State) {
			active := map[string]bool{}
			for _, t := range s.Topics {
				if t.State != raftstore.StateStopped {
					active[t.Mirror] = true
				}
			}
			for n := range mirrors {
				if !active[n] {
					delete(mirrors, n)
				}
			}
		})
		p.closeAdmins(mirrors)
		var wg sync.WaitGroup
		for _, mir := range mirrors {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.probe(mir)
			}()
		}
		wg.Wait()
	}
}

func (p *sourceProbe) probe(mir raftstore.Mirror) {
	ctx, cancel := context.WithTimeout(p.m.ctx, sourceProbeTimeout)
	defer cancel()
	p.mu.Lock()
	blocked := p.blocked[mir.Name]
	bs := mirrorprops.SourceKey(mir)
	src, ok := p.admins[mir.Name]
	if !ok || src.key != bs {
		if ok {
			src.admin.Close()
		}
		src = &probeAdmin{admin: p.m.SourceAdmin(mir), key: bs}
		p.admins[mir.Name] = src
	}
	p.mu.Unlock()
	var err error
	if blocked {
		err = errors.New("source connections blocked by a test hook")
	} else {
		_, err = src.admin.ClusterID(ctx)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil && kafka.SecurityFailure(err) {
		// The source answered, refusing kmirror's credentials or
		// certificate: it is up, and failing over would not help. The
		// partitions show the reason (FAILED).
		err = nil
	}
	if err == nil {
		if since, ok := p.down[mir.Name]; ok {
			p.m.log.Info("source cluster answers again", zap.String("mirror", mir.Name), zap.Duration("after", time.Since(since)))
		}
		delete(p.down, mir.Name)
		delete(p.why, mir.Name)
		return
	}
	if _, ok := p.down[mir.Name]; !ok {
		p.down[mir.Name] = time.Now()
		p.m.log.Warn("source cluster does not answer", zap.String("mirror", mir.Name), zap.Error(err))
	}
	p.why[mir.Name] = err.Error()
}

func (p *sourceProbe) closeAdmins(keep map[string]raftstore.Mirror) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, a := range p.admins {
		if _, ok := keep[n]; !ok {
			a.admin.Close()
			delete(p.admins, n)
			delete(p.down, n)
			delete(p.why, n)
		}
	}
}

// reach returns this member's view of every mirror's source (none
// without a probe: in-process tests).
func (p *sourceProbe) reach() []api.SourceReach {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]api.SourceReach, 0, len(p.admins))
	for n := range p.admins {
		r := api.SourceReach{Mirror: n}
		if since, ok := p.down[n]; ok {
			r.UnreachableMs, r.Error = max(time.Since(since).Milliseconds(), 1), p.why[n]
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Mirror < out[j].Mirror })
	return out
}

// unreachable reports whether the probe finds mirror's source not
// answering now (nil probe: in-process tests, it answers).
func (p *sourceProbe) unreachable(mirror string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, down := p.down[mirror]
	return down
}

// SourceUnreachable reports whether this member's probe finds the
// mirror's source not answering now (owner.Member).
func (m *Member) SourceUnreachable(mirror string) bool { return m.sources.unreachable(mirror) }

// setBlocked is the test hook that makes this member's probe of a mirror's
// source fail.
func (p *sourceProbe) setBlocked(mirror string, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.blocked[mirror] = true
	} else {
		delete(p.blocked, mirror)
	}
}

// FailoverAfter is a mirror's failover.auto.after.ms, 0 when unset or
// unreadable (leader.Member).
func (m *Member) FailoverAfter(mir raftstore.Mirror) time.Duration {
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return 0
	}
	return settings.FailoverAutoAfter
}

// DiscoveryInterval is the mirror's topics.discovery.interval
// (leader.Member); properties that no longer parse give the default.
func (m *Member) DiscoveryInterval(mir raftstore.Mirror) time.Duration {
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return mirrorprops.DefaultDiscoveryInterval
	}
	return settings.DiscoveryInterval
}

// ConfigSyncInterval is the mirror's topics.config.sync.interval
// (leader.Member).
func (m *Member) ConfigSyncInterval(mir raftstore.Mirror) time.Duration {
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return mirrorprops.DefaultConfigSyncInterval
	}
	return settings.ConfigSyncInterval
}

// Checkpointed is a partition's last checkpoint (leader.Member).
func (m *Member) Checkpointed(ctx context.Context, k fetch.Key) (fetch.Position, bool, error) {
	return m.engine.Checkpointed(ctx, k)
}
