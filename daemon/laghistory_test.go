package daemon

import (
	"testing"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
)

// TestLagSample: a sample sums each topic's known lag and keeps its
// largest time lag; an unknown lag (no source end yet) counts as none;
// the ring keeps the last hour.
func TestLagSample(t *testing.T) {
	ms := func(v int64) *int64 { return &v }
	s := lagSample(map[fetch.Key]api.LiveStatus{
		{Mirror: "m", Topic: "a", Partition: 0}: {Mirror: "m", Topic: "a", SourceEnd: 100, Lag: 40, TimeLagMs: ms(900)},
		{Mirror: "m", Topic: "a", Partition: 1}: {Mirror: "m", Topic: "a", SourceEnd: 100, Lag: 2, TimeLagMs: ms(3000)},
		{Mirror: "m", Topic: "a", Partition: 2}: {Mirror: "m", Topic: "a", SourceEnd: -1, Lag: 7},
		{Mirror: "m", Topic: "b", Partition: 0}: {Mirror: "m", Topic: "b", SourceEnd: 5, Lag: 0, TimeLagMs: ms(0)},
	})
	if got := s.Topics["m/a"]; got != (api.TopicLag{Records: 42, TimeLagMs: 3000}) {
		t.Errorf("topic a: %+v, want 42 records and 3000 ms", got)
	}
	if got, ok := s.Topics["m/b"]; !ok || got != (api.TopicLag{}) {
		t.Errorf("topic b: %+v %t, want present and 0", got, ok)
	}
	var r lagRing
	for i := range lagSamples + 10 {
		r.add(api.LagSample{AtMs: int64(i)})
	}
	if got := r.all(); len(got) != lagSamples || got[0].AtMs != 10 || got[len(got)-1].AtMs != int64(lagSamples+9) {
		t.Fatalf("ring of %d samples from %d to %d, want the last %d", len(got), got[0].AtMs, got[len(got)-1].AtMs, lagSamples)
	}
}
