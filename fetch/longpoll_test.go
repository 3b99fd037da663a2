package fetch

import (
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestLongPollWaits walks longPoll.wait through its cases: records
// flowing, an idle session, a held partition, and batches queued while
// the answers are empty (a slow destination), with the defaults.
func TestLongPollWaits(t *testing.T) {
	cfg := Config{FetchMaxWait: 100 * time.Millisecond, IdleFetchMaxWait: 5 * time.Second}
	want := map[Key]fetchWant{{Topic: "t", Partition: 0}: {}}
	empty := []kwire.FetchedPartition{{}}
	full := []kwire.FetchedPartition{{Records: []byte{1}}}
	ms := time.Millisecond
	for _, c := range []struct {
		name   string
		load   loopLoad
		answer []kwire.FetchedPartition
		waits  []time.Duration // one per request, each answered with answer
	}{
		{"records flowing", loopLoad{}, full, []time.Duration{100 * ms, 100 * ms, 100 * ms}},
		{"idle", loopLoad{}, empty, []time.Duration{100 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 5000 * ms}},
		{"busy with records", loopLoad{busy: true}, full, []time.Duration{100 * ms, 100 * ms, 100 * ms}},
		{"busy, empty answers", loopLoad{busy: true}, empty, []time.Duration{100 * ms, 100 * ms, 200 * ms, 400 * ms, 500 * ms, 500 * ms}},
		{"held", loopLoad{busy: true, held: true}, empty, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var lp longPoll
			for i, w := range c.waits {
				if got := lp.wait(cfg, want, c.load); got != w {
					t.Fatalf("request %d waits %v, want %v (waits wanted: %v)", i, got, w, c.waits)
				}
				lp.answered(c.answer)
			}
		})
	}
}

// TestConnSizerKeepsBulkReadingsAndDropsSlowly: a longer path seen in a
// bulk answer is not forgotten at the next small answer (whose
// tcpi_min_rtt still reads the old, shorter path), and the loop count
// drops only after lowerAfter readings in a row ask for fewer.
func TestConnSizerKeepsBulkReadingsAndDropsSlowly(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1000, 0)
	var s connSizer
	steps := []struct {
		at      time.Duration // after t0
		rtt     time.Duration
		bulk    bool
		current int
		want    int
	}{
		{0, 1 * ms, false, 0, 1},                // a LAN path
		{time.Second, 50 * ms, true, 1, 8},      // the path grew: a bulk answer sees it
		{2 * time.Second, 1 * ms, false, 8, 8},  // min_rtt still reads the old path: the bulk reading holds
		{29 * time.Second, 1 * ms, false, 8, 8}, // still within bulkRTTKeep
		{32 * time.Second, 1 * ms, false, 8, 8}, // kept reading expired: first lower reading
		{33 * time.Second, 1 * ms, false, 8, 8}, // second
		{34 * time.Second, 1 * ms, false, 8, 1}, // third in a row: drop
		{35 * time.Second, 12 * ms, true, 1, 3}, // rises at once
		{36 * time.Second, 1 * ms, true, 3, 3},  // one lower bulk reading
		{37 * time.Second, 20 * ms, true, 3, 5}, // a higher one resets the run
		{38 * time.Second, 1 * ms, true, 5, 5},
		{39 * time.Second, 1 * ms, true, 5, 5},
		{40 * time.Second, 1 * ms, true, 5, 1},
	}
	for i, st := range steps {
		if got, _ := s.conns(t0.Add(st.at), st.rtt, st.bulk, st.current); got != st.want {
			t.Fatalf("step %d (%+v): %d loops, want %d", i, st, got, st.want)
		}
	}
}
