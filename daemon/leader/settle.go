package leader

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// A stop that could not verify records past a partition's checkpoint
// against its source (the source was gone: an emergency or automatic
// failover) records the last verified position and the end of what it
// could not verify (PartitionInfo.UnverifiedEnd). Those records are
// kmirror's own copies whose acknowledgement was lost; until they are
// verified, a failback would take them for divergent records. The leader
// tries again every settleInterval, and once the source answers records
// the position they reach (issue 18: unverified positions were never
// settled).

// settleInterval is how often the leader tries to settle unverified
// stopped partitions; settleTimeout bounds one partition's walk.
const (
	settleInterval = 10 * time.Second
	settleTimeout  = 30 * time.Second
	// settleWarnEvery is how often a mirror that cannot be settled is
	// logged at warn (at debug in between).
	settleWarnEvery = 5 * time.Minute
)

// warnUnsettled logs why a mirror's unverified records cannot be settled:
// at warn on the first failure and every settleWarnEvery after, so an
// operator sees a source that stays unreadable, without a line per round.
func (l *Leader) warnUnsettled(mirror string, key raftstore.PartitionKey, err error) {
	log := l.log.Debug
	if now := time.Now(); now.Sub(l.settleWarned[mirror]) >= settleWarnEvery {
		if l.settleWarned == nil {
			l.settleWarned = map[string]time.Time{}
		}
		l.settleWarned[mirror] = now
		log = l.log.Warn
	}
	log("unverified records of a stopped partition cannot be settled yet; retried every 10s while this member leads",
		zap.String("mirror", mirror), zap.Stringer("partition", key), zap.Error(err))
}

// settleLoop runs settleUnverified every settleInterval until ctx ends.
func (l *Leader) settleLoop(ctx context.Context) {
	for ctx.Err() == nil {
		sleepCtx(ctx, settleInterval)
		l.settleUnverified(ctx)
	}
}

// unverifiedStop is a STOPPED partition with records left to verify.
type unverifiedStop struct {
	mir       *raftstore.Mirror
	t         *raftstore.MirrorTopic
	partition int32
}

// settleUnverified is one round: each STOPPED partition with unverified
// records is walked against its source; a mirror whose source fails one
// walk for a reason other than a mismatch is skipped for the round.
func (l *Leader) settleUnverified(ctx context.Context) {
	var todo []unverifiedStop
	l.store.Read(func(s *raftstore.State) {
		for _, t := range sortedTopics(s) {
			mir, ok := s.Mirrors[t.Mirror]
			if !ok {
				continue
			}
			for i, p := range t.Partitions {
				if p.State == raftstore.StateStopped && p.UnverifiedEnd > 0 {
					todo = append(todo, unverifiedStop{mir.Clone(), t.Clone(), int32(i)})
				}
			}
		}
	})
	failing := map[string]bool{}
	for _, u := range todo {
		if failing[u.mir.Name] || ctx.Err() != nil {
			continue
		}
		key := raftstore.PartitionKey{Mirror: u.t.Mirror, Topic: u.t.Topic, Partition: u.partition}
		cctx, cancel := context.WithTimeout(ctx, settleTimeout)
		pos, reason, err := l.member.SettleUnverified(cctx, *u.mir, *u.t, u.partition)
		cancel()
		if err != nil {
			failing[u.mir.Name] = true
			l.warnUnsettled(u.mir.Name, key, err)
			continue
		}
		if err := l.store.Apply(ctx, raftstore.SettleStopped{Key: key, Position: pos, Reason: reason}); err != nil && !errors.Is(err, raftstore.ErrInvalid) {
			l.log.Warn("record a settled last mirrored position", zap.Stringer("partition", key), zap.Error(err))
			continue
		}
		l.log.Info("settled the last mirrored position of a stopped partition against its source", zap.Stringer("partition", key),
			zap.Int64("source_offset", pos.SourceOffset), zap.Int64("destination_offset", pos.DestinationOffset), zap.String("reason", reason))
	}
}
