package leader

import (
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestNoteStuckDestination: a member the destination has not answered for
// lease_ttl while it answers another member is stuck for every mirror; one
// not answered for less, or when the destination answers nobody (moving
// would not help), is not; a source stall stays per mirror.
func TestNoteStuckDestination(t *testing.T) {
	ttl := 6 * time.Second
	down := func(d time.Duration) api.DestinationReach {
		return api.DestinationReach{UnreachableMs: d.Milliseconds(), Error: "produce unanswered"}
	}
	src := func(mirror string, d time.Duration) []api.SourceReach {
		return []api.SourceReach{{Mirror: mirror, UnreachableMs: d.Milliseconds()}}
	}
	for _, tc := range []struct {
		name  string
		views map[string]api.Reach
		stuck map[[2]string]bool // (member, mirror) pairs that are stuck
	}{
		{"destination stalled for one member", map[string]api.Reach{
			"a": {Destination: down(ttl)}, "b": {}, "c": {Destination: down(ttl - time.Millisecond)},
		}, map[[2]string]bool{{"a", "m1"}: true, {"a", "m2"}: true}},
		{"destination answers nobody", map[string]api.Reach{
			"a": {Destination: down(time.Minute)}, "b": {Destination: down(time.Minute)},
		}, nil},
		{"source stalled for one member", map[string]api.Reach{
			"a": {Sources: src("m1", ttl)}, "b": {Sources: src("m1", 0)},
		}, map[[2]string]bool{{"a", "m1"}: true}},
		{"all answer", map[string]api.Reach{"a": {}, "b": {}}, nil},
	} {
		l := &Leader{cfg: Config{LeaseTTL: ttl}, log: zaptest.NewLogger(t)}
		l.noteStuck(tc.views)
		isStuck := l.stuckNow()
		if (isStuck == nil) != (len(tc.stuck) == 0) {
			t.Fatalf("%s: stuckNow nil %t, want %t", tc.name, isStuck == nil, len(tc.stuck) == 0)
		}
		if isStuck == nil {
			continue
		}
		for _, member := range []string{"a", "b", "c"} {
			for _, mirror := range []string{"m1", "m2"} {
				if got, want := isStuck(member, mirror), tc.stuck[[2]string{member, mirror}]; got != want {
					t.Errorf("%s: stuck(%s, %s) = %t, want %t", tc.name, member, mirror, got, want)
				}
			}
		}
	}
}

// TestStuckCooldown: a member that stops being stuck gets no partitions
// for a cooldown (1 min, doubled at each new stall, at most 30 min), so a
// link that stalls under load does not take its partitions back and stall
// them again every round; long well, the cooldown starts over.
func TestStuckCooldown(t *testing.T) {
	ttl := 6 * time.Second
	now := time.Unix(1_000_000, 0)
	l := &Leader{cfg: Config{LeaseTTL: ttl}, log: zaptest.NewLogger(t), now: func() time.Time { return now }}
	stalled := map[string]api.Reach{"a": {Destination: api.DestinationReach{UnreachableMs: ttl.Milliseconds(), Error: "produce unanswered"}}, "b": {}}
	well := map[string]api.Reach{"a": {}, "b": {}}
	stuckFor := func(member string) bool {
		f := l.stuckNow()
		return f != nil && f(member, "m1")
	}
	for round, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute} {
		l.noteStuck(stalled)
		if !stuckFor("a") {
			t.Fatalf("round %d: a stalled member is not stuck", round)
		}
		l.noteStuck(well)
		now = now.Add(want - time.Second)
		if !stuckFor("a") {
			t.Fatalf("round %d: %s after it recovered, a gets partitions again; want a cooldown of %s", round, want-time.Second, want)
		}
		if stuckFor("b") {
			t.Fatalf("round %d: b never stalled but is stuck", round)
		}
		now = now.Add(2 * time.Second)
		if stuckFor("a") {
			t.Fatalf("round %d: the cooldown of %s did not end", round, want)
		}
	}
	// Well for longer than the longest cooldown: the next one is 1 min again.
	now = now.Add(maxCooldown + time.Second)
	l.noteStuck(well)
	l.noteStuck(stalled)
	l.noteStuck(well)
	now = now.Add(time.Minute + time.Second)
	if stuckFor("a") {
		t.Fatal("after a long well period the cooldown did not start over at 1 min")
	}
}
