package daemon

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/ops"
	"github.com/kmirror/kmirror/raftstore"
)

// mirroredBy returns each topic of the state that is not STOPPED, with its
// mirror.
func mirroredBy(l *Member) map[string]string {
	out := map[string]string{}
	l.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.State != raftstore.StateStopped {
				out[t.Topic] = t.Mirror
			}
		}
	})
	return out
}

// TestTopicPatterns: add --include saves the patterns and adds what they
// match now, never internal (__*) or excluded topics, and skips, naming
// why, a topic another mirror mirrors; the leader's discovery adds a topic
// created later; a topic removed from the mirror is not added again; the
// skipped topics are shown by describe; a removed pattern adds nothing
// more; bad patterns are refused with what to write (issue 21).
func TestTopicPatterns(t *testing.T) {
	src, dst := addClusters(t, "orders.a", "orders.b", "orders.tmp", "__orders.internal", "payments", "orders.x")
	l := addLeader(t, src, dst)
	ctx := context.Background()
	if err := l.store.Apply(ctx, raftstore.AlterMirror{Name: "m", Bootstrap: src.ListenAddrs(),
		Properties: map[string]string{"bootstrap.servers": src.ListenAddrs()[0], "topics.discovery.interval": "500"}}); err != nil {
		t.Fatal(err)
	}
	if err := l.store.Apply(ctx, raftstore.CreateMirror{Mirror: raftstore.Mirror{Name: "m2", Bootstrap: src.ListenAddrs()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m2", Topics: []string{"orders.x"}}); err != nil {
		t.Fatal(err)
	}

	res, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m", Include: []string{`(__)?orders\..*`, `nomatch-.*`}, Exclude: []string{`.*\.tmp`}})
	if err != nil {
		t.Fatal(err)
	}
	var added []string
	for _, r := range res.Topics {
		if r.Result == api.TopicAdded {
			added = append(added, r.Topic)
		}
	}
	if !slices.Equal(added, []string{"orders.a", "orders.b"}) {
		t.Fatalf("add --include added %v (%+v), want orders.a and orders.b", added, res.Topics)
	}
	if len(res.Notes) != 2 || !strings.Contains(res.Notes[0], "nomatch-.* matches no source topic") ||
		!strings.Contains(res.Notes[1], "orders.x skipped: matched, but mirrored by mirror m2") {
		t.Fatalf("notes %q, want one naming the pattern that matches nothing and one the match mirrored by m2", res.Notes)
	}
	want := map[string]string{"orders.a": "m", "orders.b": "m", "orders.x": "m2"}
	if got := mirroredBy(l); !maps.Equal(got, want) {
		t.Fatalf("mirrored %v, want %v (no internal, excluded or unmatched topic)", got, want)
	}
	var mir raftstore.Mirror
	l.store.Read(func(s *raftstore.State) { mir = *s.Mirrors["m"].Clone() })
	if !strings.Contains(mir.Skipped["orders.x"], "mirrored by mirror m2") || len(mir.Skipped) != 1 {
		t.Fatalf("skipped %v, want orders.x named as mirrored by m2", mir.Skipped)
	}

	// A topic created later is found by the leader's discovery loop.
	if err := src.CreateTopic("orders.c", 1, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "orders.c added by discovery", func() bool { return mirroredBy(l)["orders.c"] == "m" })

	// A topic removed from the mirror is not added again, and says so.
	if err := l.store.Apply(ctx, raftstore.SetTopicState{Mirror: "m", Topic: "orders.a", State: raftstore.StateStopped}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "orders.a named as removed", func() bool {
		var why string
		l.store.Read(func(s *raftstore.State) { why = s.Mirrors["m"].Skipped["orders.a"] })
		return strings.Contains(why, "removed from mirror m")
	})
	if _, ok := mirroredBy(l)["orders.a"]; ok {
		t.Fatal("a removed topic was added again by the patterns")
	}
	var rows []api.PartitionStatus
	l.store.Read(func(s *raftstore.State) { rows = ops.SkippedRows(s, "m", "") })
	skippedRows := map[string]string{}
	for _, r := range rows {
		if r.State == api.StateSkipped {
			skippedRows[r.Topic] = r.Reason
		}
	}
	if len(skippedRows) != 2 || skippedRows["orders.x"] == "" || skippedRows["orders.a"] == "" {
		t.Fatalf("describe's SKIPPED rows %v, want orders.x and orders.a", skippedRows)
	}
	sums, err := l.ListMirrors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sums[0].Include, []string{`(__)?orders\..*`, `nomatch-.*`}) || !slices.Equal(sums[0].Exclude, []string{`.*\.tmp`}) {
		t.Fatalf("list shows patterns %v / %v", sums[0].Include, sums[0].Exclude)
	}

	// A removed pattern adds nothing more; the topics it added stay.
	if _, err := l.SetTopicPatterns(ctx, api.PatternsRequest{Mirror: "m", Include: []string{`(__)?orders\..*`}, Remove: true}); err != nil {
		t.Fatal(err)
	}
	if err := src.CreateTopic("orders.d", 1, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // three discovery intervals
	if got := mirroredBy(l); got["orders.d"] != "" || got["orders.b"] != "m" || got["orders.c"] != "m" {
		t.Fatalf("after the pattern was removed: %v, want orders.d not added and orders.b, orders.c kept", got)
	}

	// Bad input.
	for _, c := range []struct {
		name string
		err  error
		call func() error
	}{
		{"invalid regex", api.ErrInvalid, func() error {
			_, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m", Include: []string{"orders["}})
			return err
		}},
		{"exclude with no include", api.ErrInvalid, func() error {
			_, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m2", Exclude: []string{"x.*"}})
			return err
		}},
		{"remove a pattern not there", api.ErrNotFound, func() error {
			_, err := l.SetTopicPatterns(ctx, api.PatternsRequest{Mirror: "m", Include: []string{"zzz"}, Remove: true})
			return err
		}},
		{"unknown mirror", api.ErrNotFound, func() error {
			_, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "nope", Include: []string{"a.*"}})
			return err
		}},
	} {
		if err := c.call(); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}
