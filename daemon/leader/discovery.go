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

// discoveryTimeout bounds one mirror's discovery round (listing the
// source's topics and adding the new matches).
const discoveryTimeout = 5 * time.Minute

// discoveryLoop runs, while this member leads, each mirror's topic
// discovery (kmirror add --include; ops.DiscoverTopics) every
// topics.discovery.interval, the first at once: a new leader picks up
// what its predecessor had not added yet.
func (l *Leader) discoveryLoop(ctx context.Context) {
	last := map[string]time.Time{}
	for ctx.Err() == nil {
		var due []raftstore.Mirror
		l.store.Read(func(s *raftstore.State) {
			for _, m := range s.Mirrors {
				if len(m.Include) > 0 {
					due = append(due, *m.Clone())
				}
			}
		})
		for _, mir := range due {
			if ctx.Err() != nil {
				return
			}
			if at, ok := last[mir.Name]; ok && time.Since(at) < l.member.DiscoveryInterval(mir) {
				continue
			}
			last[mir.Name] = time.Now()
			dctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
			if _, err := l.member.DiscoverTopics(dctx, mir.Name); err != nil && ctx.Err() == nil {
				l.log.Warn("topic discovery", zap.String("mirror", mir.Name), zap.Error(err))
			}
			cancel()
		}
		sleepCtx(ctx, discoveryTick)
	}
}
