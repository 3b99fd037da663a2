package leader

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// discoveryTick is how often the discovery loop looks for a mirror whose
// topics.discovery.interval has passed.
const discoveryTick = 250 * time.Millisecond

// discoveryTimeout bounds one mirror's discovery or config sync round.
const discoveryTimeout = 5 * time.Minute

// discoveryLoop runs, while this member leads, each mirror's topic
// discovery (kmirror add --include; ops.DiscoverTopics) every
// topics.discovery.interval, the first at once: a new leader picks up
// what its predecessor had not added yet.
func (l *Leader) discoveryLoop(ctx context.Context) {
	l.everyMirror(ctx, "topic discovery", func(m *raftstore.Mirror) bool { return len(m.Include) > 0 }, l.member.DiscoveryInterval,
		func(ctx context.Context, mirror string) error {
			_, err := l.member.DiscoverTopics(ctx, mirror)
			return err
		})
}

// configSyncLoop copies changed source topic configs to each mirror's
// topics (ops.SyncTopicConfigs) every topics.config.sync.interval.
func (l *Leader) configSyncLoop(ctx context.Context) {
	l.everyMirror(ctx, "topic config sync", func(*raftstore.Mirror) bool { return true }, l.member.ConfigSyncInterval, l.member.SyncTopicConfigs)
}

// everyMirror runs round for each mirror that wants it, every interval of
// that mirror, the first at once, until ctx ends.
func (l *Leader) everyMirror(ctx context.Context, what string, wants func(*raftstore.Mirror) bool,
	interval func(raftstore.Mirror) time.Duration, round func(ctx context.Context, mirror string) error) {
	last := map[string]time.Time{}
	for ctx.Err() == nil {
		var due []raftstore.Mirror
		l.store.Read(func(s *raftstore.State) {
			for _, m := range s.Mirrors {
				if wants(m) {
					due = append(due, *m.Clone())
				}
			}
		})
		for _, mir := range due {
			if ctx.Err() != nil {
				return
			}
			if at, ok := last[mir.Name]; ok && time.Since(at) < interval(mir) {
				continue
			}
			last[mir.Name] = time.Now()
			rctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
			if err := round(rctx, mir.Name); err != nil && ctx.Err() == nil {
				l.log.Warn(what, zap.String("mirror", mir.Name), zap.Error(err))
			}
			cancel()
		}
		sleepCtx(ctx, discoveryTick)
	}
}
