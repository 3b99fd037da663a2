package daemon

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// rateClock is a member's clock in the tier (raftstore.Clock) running at
// rate times the process clock's: a member's lease window and the
// leader's takeover are durations each on its own clock, so a rate is all
// that can differ between two members' clocks. SetRate changes it from
// now on (times read before map back at the new rate).
type rateClock struct {
	mu sync.Mutex
	// anchorReal on the process clock is anchorLocal on this one.
	anchorReal, anchorLocal time.Time
	rate                    float64
}

func newRateClock() *rateClock {
	now := time.Now()
	return &rateClock{anchorReal: now, anchorLocal: now, rate: 1}
}

func (c *rateClock) Now() time.Time { return c.Local(time.Now()) }

func (c *rateClock) Local(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.anchorLocal.Add(time.Duration(float64(t.Sub(c.anchorReal)) * c.rate))
}

func (c *rateClock) Real(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.anchorReal.Add(time.Duration(float64(t.Sub(c.anchorLocal)) / c.rate))
}

// SetRate makes the clock run at rate times the process clock's from now.
func (c *rateClock) SetRate(rate float64) {
	real := time.Now()
	local := c.Local(real)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.anchorReal, c.anchorLocal, c.rate = real, local, rate
}

// takeOverWithClocks cuts off a writing follower whose clock runs at
// victimRate while every other member's runs at othersRate, waits until
// its partitions are written by others, lets the victim's lease run out
// on its own clock, and returns the one-writer violations of the history
// and the victim's ID.
func takeOverWithClocks(t *testing.T, victimRate, othersRate float64) (bad []string, victimID string) {
	g, h, _, stop := tierGroup(t, 6)
	v, victim, owned := g.writingFollower(h)
	for i, c := range g.clocks {
		if i == v {
			c.SetRate(victimRate)
		} else {
			c.SetRate(othersRate)
		}
	}
	time.Sleep(time.Second) // a renewal or two on the new rates
	cut := time.Now()
	g.isolate(v)
	g.takenOver(h, v, owned, cut)
	// The victim stops by its own clock: wait until its window is over
	// however slow that clock runs.
	waitFor(t, 20*tierLeaseTTL, victim.cfg.NodeID+" fenced", func() bool {
		return victim.own.WriteDeadline().IsZero()
	})
	time.Sleep(inFlight(victim))
	stop()
	return h.check(inFlight(victim)), victim.cfg.NodeID
}

// maxClockRateError is the most a member's clock may run off the
// process's that the lease window allows for (daemon/owner's constant of
// the same name, 500 ppm).
const maxClockRateError = 500e-6

// TestTierOneWriterWithClocksAtTheRateBound: the member cut off runs its
// clock slow and the leader and the others run theirs fast, each by the
// most a clock may be off (maxClockRateError): its window still ends, and
// its last request is answered, before the leader gives its partitions
// away (issue 19: per-member clocks).
func TestTierOneWriterWithClocksAtTheRateBound(t *testing.T) {
	const bound = maxClockRateError
	if bad, _ := takeOverWithClocks(t, 1-bound, 1+bound); len(bad) > 0 {
		t.Fatalf("%d one-writer violations with clocks %v apart, first: %v", len(bad), 2*bound, bad[:min(len(bad), 5)])
	}
}

// TestTierSeesAClockBeyondTheBound: the same takeover with clock rates
// far beyond what the lease window allows for: the cut-off member's clock
// at half speed, or the leader's (and the others') at double speed. The
// member's window then ends after the leader gave its partitions away, and
// the history check must say so: the tier's clocks reach both sides of the
// lease (the member's window, the leader's grants and takeover) and the
// checker sees a clock-rate fault, so the test above could fail.
func TestTierSeesAClockBeyondTheBound(t *testing.T) {
	for _, c := range []struct {
		name           string
		victim, others float64
	}{{"member slow", 0.5, 1}, {"leader fast", 1, 2}} {
		t.Run(c.name, func(t *testing.T) {
			all, victim := takeOverWithClocks(t, c.victim, c.others)
			// Only the cut-off member's late writes count: an unrelated
			// violation must not pass for the one looked for.
			var bad []string
			for _, v := range all {
				if strings.Contains(v, ": "+victim+" ") {
					bad = append(bad, v)
				}
			}
			if len(bad) == 0 {
				t.Fatalf("with the cut-off member's clock at %vx and the others' at %vx the history check found no write after the takeover: "+
					"the lease is not timed on the members' clocks, or the check misses late writes", c.victim, c.others)
			}
			t.Logf("found as expected, %d violations, first and last: %s; %s", len(bad), bad[0], bad[len(bad)-1])
		})
	}
}
