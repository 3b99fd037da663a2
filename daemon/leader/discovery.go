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

// roundRetry is how soon a failed discovery or config sync round runs
// again, at most (the mirror's interval when that is shorter).
const roundRetry = 5 * time.Second

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
// that mirror, the first at once, until ctx ends. A round that failed (a
// cluster did not answer) runs again after roundRetry when that is
// sooner: a broker restart should not leave a mirror a whole interval
// behind.
func (l *Leader) everyMirror(ctx context.Context, what string, wants func(*raftstore.Mirror) bool,
	interval func(raftstore.Mirror) time.Duration, round func(ctx context.Context, mirror string) error) {
	last := map[string]time.Time{}
	failed := map[string]bool{}
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
			wait := interval(mir)
			if failed[mir.Name] {
				wait = min(wait, roundRetry)
			}
			if at, ok := last[mir.Name]; ok && time.Since(at) < wait {
				continue
			}
			last[mir.Name] = time.Now()
			rctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
			err := round(rctx, mir.Name)
			cancel()
			failed[mir.Name] = err != nil
			if err != nil && ctx.Err() == nil {
				l.log.Warn(what+" round failed; tried again soon", zap.String("mirror", mir.Name),
					zap.Duration("retry", min(interval(mir), roundRetry)), zap.Error(err))
			}
		}
		sleepCtx(ctx, discoveryTick)
	}
}
