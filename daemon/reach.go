package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
)

// What a member reaches: every mirror's source (sourceProbe) and the
// destination (destinationProbe, and the produce requests of its own
// partitions that went unanswered). The raft leader asks every member for
// this view each second: automatic failover reads the sources, placement
// moves partitions off a member that cannot do their work while another
// member can (issue 18: a member whose link stalled kept its partitions).

// destinationProbe is a member's probe of the destination cluster.
type destinationProbe struct {
	m  *Member
	mu sync.Mutex
	// down is when the destination last went from answering to not
	// answering (zero: it answers); why is the failure.
	down time.Time
	why  string
	// answered is when the probe last succeeded.
	answered time.Time
	// produceDown is since when a produce of this member's went
	// unanswered, kept after the partition moved away (its produce was
	// dropped, not answered) until the probe succeeds after it: else the
	// member looked answered again a second after its partitions left a
	// stalled link, and got them back (issue 18); produceWhy says which.
	produceDown time.Time
	produceWhy  string
	// unansweredProduce is the engine's OldestUnansweredProduce (a field
	// for tests).
	unansweredProduce func() (time.Time, fetch.Key)
}

// loop asks the destination for its metadata each sourceProbeInterval,
// each ask bounded by sourceProbeTimeout.
func (p *destinationProbe) loop() {
	t := time.NewTicker(sourceProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-p.m.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(p.m.ctx, sourceProbeTimeout)
		_, err := p.m.dest.ClusterID(ctx)
		cancel()
		p.mu.Lock()
		if err == nil {
			p.answered = time.Now()
		}
		switch {
		case err == nil && !p.down.IsZero():
			p.m.log.Info("destination cluster answers again", zap.Duration("after", time.Since(p.down)))
			p.down, p.why = time.Time{}, ""
		case err != nil && p.m.ctx.Err() == nil:
			if p.down.IsZero() {
				p.down = time.Now()
				p.m.log.Warn("destination cluster does not answer", zap.Error(err))
			}
			p.why = err.Error()
		}
		p.mu.Unlock()
	}
}

// unanswered is since when the destination has not answered this member
// (zero: it answers): the earlier of when its probe began to fail and
// when a produce of one of its partitions went unanswered
// (fetch.Engine.OldestUnansweredProduce), with why. Without a probe
// (in-process tests) the destination answers.
func (p *destinationProbe) unanswered() (time.Time, string) {
	if p == nil {
		return time.Time{}, ""
	}
	oldest := p.unansweredProduce
	if oldest == nil {
		oldest = p.m.engine.OldestUnansweredProduce
	}
	first, k := oldest()
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !first.IsZero() && (p.produceDown.IsZero() || first.Before(p.produceDown)):
		p.produceDown = first
		p.produceWhy = fmt.Sprintf("the destination has not answered a produce to %s since %s", k, first.UTC().Format(time.RFC3339))
	case first.IsZero() && !p.produceDown.IsZero() && p.answered.After(p.produceDown):
		p.produceDown, p.produceWhy = time.Time{}, ""
	}
	since, why := p.down, p.why
	if !p.produceDown.IsZero() && (since.IsZero() || p.produceDown.Before(since)) {
		since, why = p.produceDown, p.produceWhy
	}
	return since, why
}

// reach is this member's view of the destination (unanswered).
func (p *destinationProbe) reach() api.DestinationReach {
	since, why := p.unanswered()
	if since.IsZero() {
		return api.DestinationReach{}
	}
	return api.DestinationReach{UnreachableMs: max(time.Since(since).Milliseconds(), 1), Error: why}
}

// DestinationUnanswered is since when the destination has not answered
// this member, zero while it answers (owner.Member: a handoff does not
// drain over a link that does not answer).
func (m *Member) DestinationUnanswered() time.Time {
	since, _ := m.destination.unanswered()
	return since
}

// LocalReach serves /v1/internal/reach: this member's view of every
// mirror's source and of the destination.
func (m *Member) LocalReach() api.Reach {
	return api.Reach{Sources: m.sources.reach(), Destination: m.destination.reach()}
}

// Reaches asks every member (this one locally) what it reaches; a member
// that does not answer within 2 s is left out (leader.Member).
func (m *Member) Reaches(ctx context.Context) map[string]api.Reach {
	views, _ := askOthers(ctx, m, 2*time.Second, (*api.Client).InternalReach)
	views[m.cfg.NodeID] = m.LocalReach()
	return views
}
