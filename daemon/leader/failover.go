package leader

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// checkAutoFailover is the leader's decision, once per round: for each
// mirror with failover.auto.after.ms set and topics still mirroring, it
// asks every member how long the source has not answered and fails the
// mirror over when a majority of the members say longer than that.
func (l *Leader) checkAutoFailover(ctx context.Context, views map[string]api.Reach) {
	type candidate struct {
		after  time.Duration
		topics []string
	}
	cands := map[string]*candidate{}
	var members []string
	l.store.Read(func(s *raftstore.State) {
		for id := range s.Members {
			members = append(members, id)
		}
		for _, t := range s.Topics {
			mir, ok := s.Mirrors[t.Mirror]
			if !ok || (t.State != raftstore.StateMirroring && t.State != raftstore.StateFailed && t.State != raftstore.StatePaused) {
				continue
			}
			after := l.member.FailoverAfter(*mir)
			if after <= 0 {
				continue
			}
			c := cands[t.Mirror]
			if c == nil {
				c = &candidate{after: after}
				cands[t.Mirror] = c
			}
			c.topics = append(c.topics, t.Topic)
		}
	})
	if len(cands) == 0 {
		return
	}
	for mirror, c := range cands {
		var down []string
		var why string
		for id, view := range views {
			for _, r := range view.Sources {
				if r.Mirror == mirror && time.Duration(r.UnreachableMs)*time.Millisecond >= c.after {
					down = append(down, id)
					why = r.Error
				}
			}
		}
		if len(down) <= len(members)/2 {
			continue
		}
		sort.Strings(down)
		sort.Strings(c.topics)
		reason := raftstore.ReasonAutomaticFailover + fmt.Sprintf("the source cluster of mirror %s did not answer members %s (a majority of %d) for %s "+
			"(failover.auto.after.ms=%d); last error: %s", mirror, strings.Join(down, ", "), len(members), c.after,
			c.after.Milliseconds(), why)
		l.log.Warn("automatic failover", zap.String("mirror", mirror), zap.Strings("topics", c.topics), zap.String("reason", reason))
		for _, topic := range c.topics {
			if err := l.store.Apply(ctx, raftstore.SetTopicState{Mirror: mirror, Topic: topic, State: raftstore.StateStopping, Reason: reason}); err != nil {
				l.log.Warn("automatic failover of a topic failed; retrying", zap.String("mirror", mirror), zap.String("topic", topic), zap.Error(err))
				continue
			}
			l.autoFailovers.add(mirror)
		}
	}
}

// counter counts per mirror, for /metrics.
type counter struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *counter) add(mirror string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int64{}
	}
	c.n[mirror]++
}

func (c *counter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// noteStuck records, from every member's view, the members that cannot do
// a partition's work while another member can: those that have not
// reached a mirror's source for lease_ttl while another member reaches it
// now, and those the destination has not answered for lease_ttl (its
// metadata probe, or a produce left unanswered) while it answers another
// member. Placement moves their partitions to members that can do the
// work (PlanAssignments' stuck; issue 18: a member whose link stalled
// kept its partitions).
func (l *Leader) noteStuck(views map[string]api.Reach) {
	reached := map[string]bool{}
	destReached := false
	for _, view := range views {
		for _, r := range view.Sources {
			if r.UnreachableMs == 0 {
				reached[r.Mirror] = true
			}
		}
		destReached = destReached || view.Destination.UnreachableMs == 0
	}
	lapsed := func(ms int64) bool { return time.Duration(ms)*time.Millisecond >= l.cfg.LeaseTTL }
	stuck := map[[2]string]string{}
	destStuck := map[string]string{}
	for id, view := range views {
		for _, r := range view.Sources {
			if reached[r.Mirror] && lapsed(r.UnreachableMs) {
				stuck[[2]string{id, r.Mirror}] = r.Error
			}
		}
		if destReached && lapsed(view.Destination.UnreachableMs) {
			destStuck[id] = view.Destination.Error
		}
	}
	l.stuckMu.Lock()
	defer l.stuckMu.Unlock()
	for k, why := range stuck {
		if _, was := l.stuck[k]; !was {
			l.log.Warn("member cannot reach a mirror's source that others reach: its partitions of the mirror move to them",
				zap.String("member", k[0]), zap.String("mirror", k[1]), zap.String("error", why))
		}
	}
	for k := range l.stuck {
		if _, still := stuck[k]; !still {
			l.log.Info("member reaches the mirror's source again; it gets partitions of the mirror once its cooldown ends",
				zap.String("member", k[0]), zap.String("mirror", k[1]), zap.Duration("cooldown", l.cool(k)))
		}
	}
	for id, why := range destStuck {
		if _, was := l.destStuck[id]; !was {
			l.log.Warn("the destination does not answer a member while it answers others: the member's partitions move to them",
				zap.String("member", id), zap.String("error", why))
		}
	}
	for id := range l.destStuck {
		if _, still := destStuck[id]; !still {
			l.log.Info("the destination answers the member again; it gets partitions once its cooldown ends",
				zap.String("member", id), zap.Duration("cooldown", l.cool([2]string{id, ""})))
		}
	}
	for k, c := range l.cooling {
		if l.clock().Sub(c.until) > maxCooldown {
			delete(l.cooling, k) // healthy long enough: the next stall starts over
		}
	}
	l.stuck, l.destStuck = stuck, destStuck
}

// A member that stops being stuck gets no partitions for a cooldown, 1 min
// at first, doubled (up to maxCooldown) each time it is stuck again before
// it has been well for maxCooldown past the last one. Its link may stall
// only under load (one broker of many, a congested path): without the
// cooldown, its partitions came back at the next round once it had none,
// stalled again and moved again, every lease_ttl or so (issue 18).
const (
	minCooldown = time.Minute
	maxCooldown = 30 * time.Minute
)

// cooldown is one (member, mirror) pair's: no partitions before until;
// next is the cooldown of its next recovery.
type cooldown struct {
	until time.Time
	next  time.Duration
}

// cool starts k's cooldown (stuckMu held) and returns its length.
func (l *Leader) cool(k [2]string) time.Duration {
	if l.cooling == nil {
		l.cooling = map[[2]string]cooldown{}
	}
	d := l.cooling[k].next
	if d == 0 {
		d = minCooldown
	}
	l.cooling[k] = cooldown{until: l.clock().Add(d), next: min(2*d, maxCooldown)}
	return d
}

func (l *Leader) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// stuckNow is PlanAssignments' stuck for this round (source or
// destination): a copy of noteStuck's findings, members in their cooldown
// included, or nil when no member is stuck (placement then checks nothing
// per partition).
func (l *Leader) stuckNow() func(member, mirror string) bool {
	l.stuckMu.Lock()
	defer l.stuckMu.Unlock()
	now := l.clock()
	cooling := map[[2]string]bool{}
	for k, c := range l.cooling {
		if now.Before(c.until) {
			cooling[k] = true
		}
	}
	if len(l.stuck) == 0 && len(l.destStuck) == 0 && len(cooling) == 0 {
		return nil
	}
	stuck, destStuck := maps.Clone(l.stuck), maps.Clone(l.destStuck)
	return func(member, mirror string) bool {
		_, ok := stuck[[2]string{member, mirror}]
		_, dest := destStuck[member]
		return ok || dest || cooling[[2]string{member, mirror}] || cooling[[2]string{member, ""}]
	}
}
