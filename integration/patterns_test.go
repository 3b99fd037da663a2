package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestTopicPatternsDiscoverTopics (issue 21): with include pattern
// (__)?pat\..* and exclude .*\.tmp saved on a mirror, 200 topics are
// created on the source at random times while it runs (170 matching, 20
// excluded, 10 with internal-looking __ names), each with records right
// after its creation. Every match is mirrored, equal record by record
// (key, value, headers, timestamp, offsets); no excluded or internal one
// is; the discovery lag, creation to first record mirrored, is printed.
func TestTopicPatternsDiscoverTopics(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const mirror = "pat"
	err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "topics.discovery.interval": "1000"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The shared member goes on with the package's other tests: its
		// 171 topics go (each removed as remove does).
		start := time.Now()
		if err := m.client.DeleteMirror(context.Background(), mirror, true); err != nil {
			t.Errorf("delete mirror %s: %v", mirror, err)
		}
		t.Logf("mirror %s deleted with its topics in %v", mirror, time.Since(start).Round(time.Millisecond))
	})
	// One topic exists before the patterns: added at once by add --include.
	if err := env.src.CreateTopic(ctx, "pat.first", 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	producer := kgoClient(t, env.src)
	produceSync(t, producer, keyedRecords("pat.first", 0, 5))
	res, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirror, Include: []string{`(__)?pat\..*`}, Exclude: []string{`.*\.tmp`}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Topics) != 1 || res.Topics[0].Topic != "pat.first" || res.Topics[0].Result != api.TopicAdded {
		t.Fatalf("add --include: %+v, want pat.first added", res.Topics)
	}

	var names []string
	for i := range 200 {
		switch {
		case i%20 == 7:
			names = append(names, fmt.Sprintf("__pat.%d", i))
		case i%10 == 3:
			names = append(names, fmt.Sprintf("pat.%d.tmp", i))
		default:
			names = append(names, fmt.Sprintf("pat.%d", i))
		}
	}
	rand.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	matches := func(n string) bool { return strings.HasPrefix(n, "pat.") && !strings.HasSuffix(n, ".tmp") }

	// Watch describe for each topic's first mirrored record.
	var mu sync.Mutex
	created, mirrored := map[string]time.Time{}, map[string]time.Time{}
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for wctx.Err() == nil {
			rows, err := m.client.Describe(wctx, mirror, "")
			now := time.Now()
			if err == nil {
				mu.Lock()
				for _, r := range rows {
					if _, seen := mirrored[r.Topic]; !seen && r.Partition >= 0 && r.DestinationOffset > 0 {
						mirrored[r.Topic] = now
					}
				}
				mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	defer func() { stopWatch(); wg.Wait() }()

	start := time.Now()
	for _, n := range names {
		time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
		if err := env.src.CreateTopic(ctx, n, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		created[n] = time.Now()
		mu.Unlock()
		produceSync(t, producer, keyedRecords(n, 0, 3))
	}
	t.Logf("created 200 topics over %v", time.Since(start).Round(time.Millisecond))

	want := []string{"pat.first"}
	for _, n := range names {
		if matches(n) {
			want = append(want, n)
		}
	}
	sort.Strings(want)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		mu.Lock()
		done := true
		for _, n := range want {
			if _, ok := mirrored[n]; !ok {
				done = false
			}
		}
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			var missing []string
			for _, n := range want {
				if _, ok := mirrored[n]; !ok {
					missing = append(missing, n)
				}
			}
			mu.Unlock()
			t.Fatalf("%d of %d matching topics never mirrored a record: %v", len(missing), len(want), missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stopWatch()
	wg.Wait()

	sums, err := m.client.ListMirrors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sums {
		if s.Name == mirror {
			got = s.Topics
			if !slices.Equal(s.Include, []string{`(__)?pat\..*`}) || !slices.Equal(s.Exclude, []string{`.*\.tmp`}) {
				t.Fatalf("list shows patterns %v / %v", s.Include, s.Exclude)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("mirror %s mirrors %d topics, want the %d matches (no excluded, no internal): extra or missing in %v", mirror, len(got), len(want), got)
	}
	waitCaughtUp(t, m, mirror, want...)
	for _, n := range want {
		requireSameRecords(t, readAll(t, env.src, n, 1, true), readAll(t, env.dst, n, 1, true))
	}

	// A matched topic deleted on the source stays on the destination as
	// it was, its partitions FAILED saying why (as KIP-1279 shows it);
	// discovery neither removes nor re-adds it.
	gone := want[1]
	kept := readAll(t, env.src, gone, 1, true)
	deleteTopic(t, env.src, gone)
	waitAllStates(t, m, mirror, gone, "FAILED", "source topic "+gone+" no longer exists", 90*time.Second)
	requireSameRecords(t, kept, readAll(t, env.dst, gone, 1, true))
	if sums, err = m.client.ListMirrors(ctx); err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.Name == mirror && !slices.Contains(s.Topics, gone) {
			t.Fatalf("after %s was deleted on the source, mirror %s no longer lists it: %v", gone, mirror, s.Topics)
		}
	}

	var lags []time.Duration
	for n, c := range created {
		if matches(n) {
			lags = append(lags, mirrored[n].Sub(c))
		}
	}
	slices.Sort(lags)
	t.Logf("discovery lag, topic creation to its first record mirrored (topics.discovery.interval 1s, describe polled every 100 ms), %d topics: "+
		"p50 %v, p90 %v, max %v", len(lags), lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)*9/10].Round(time.Millisecond),
		lags[len(lags)-1].Round(time.Millisecond))
	fmt.Printf("FIGURE discovery lag (creation -> first record mirrored, interval 1s): p50 %v p90 %v max %v over %d topics\n",
		lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)*9/10].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond), len(lags))
}
