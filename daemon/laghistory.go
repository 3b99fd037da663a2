package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

// Lag history for the status page (issue 22, section 3): every
// lagSampleEvery each member samples the whole group's lag (the live
// statuses describe reads) into a ring of the last hour, so any member
// draws the charts without an external service.
const (
	lagSampleEvery = 15 * time.Second
	lagSamples     = int(time.Hour / lagSampleEvery)
)

// lagRing is the last hour of lag samples, oldest first.
type lagRing struct {
	mu      sync.Mutex
	samples []api.LagSample
}

func (r *lagRing) add(s api.LagSample) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	if len(r.samples) > lagSamples {
		r.samples = append(r.samples[:0:0], r.samples[len(r.samples)-lagSamples:]...)
	}
}

func (r *lagRing) all() []api.LagSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]api.LagSample(nil), r.samples...)
}

// LagHistory returns the last hour of lag samples, oldest first
// (api.LagHistorian).
func (m *Member) LagHistory() []api.LagSample { return m.lagRing.all() }

// lagSampler samples the group's lag until ctx ends.
func (m *Member) lagSampler(ctx context.Context) {
	t := time.NewTicker(lagSampleEvery)
	defer t.Stop()
	for {
		live, _ := m.LiveStatuses(ctx)
		m.lagRing.add(lagSample(live))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lagSample sums live statuses per topic: records not yet mirrored (lag
// known) and the largest time lag.
func lagSample[K comparable](live map[K]api.LiveStatus) api.LagSample {
	s := api.LagSample{AtMs: time.Now().UnixMilli(), Topics: map[string]api.TopicLag{}}
	for _, st := range live {
		k := st.Mirror + "/" + st.Topic
		tl := s.Topics[k]
		if st.SourceEnd >= 0 && st.Lag > 0 {
			tl.Records += st.Lag
		}
		if st.TimeLagMs != nil {
			tl.TimeLagMs = max(tl.TimeLagMs, *st.TimeLagMs)
		}
		s.Topics[k] = tl
	}
	return s
}
