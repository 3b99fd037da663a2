package integration

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/truncate"
)

// Two clusters mirroring each other (issue 21, section 4). A is the shared
// source cluster, B the shared destination; a member beside B mirrors A->B
// (mirror "ab"), one beside A mirrors B->A (mirror "ba").

// TestMirrorLoopRefused: with A->B mirroring a topic, an add of B->A for it
// on A's group is refused, naming the mirror and the way on; after a
// failover to B and the failback B->A, the old A->B add (with or without
// --truncate) is refused the same way on B's group, and nothing on either
// cluster changes: B stays writable, A stays its exact copy.
func TestMirrorLoopRefused(t *testing.T) {
	ctx := context.Background()
	const topic = "loop-e"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 30))
	mB := sideMember(t, "loop-beside-b", env.dst, env.src, "ab")
	mA := sideMember(t, "loop-beside-a", env.src, env.dst, "ba")
	if err := mB.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "ab", Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "topics.config.sync.interval": "1000"}}); err != nil {
		t.Fatal(err)
	}
	addCaughtUp(t, mB, "ab", topic)

	// The active record B's group wrote at the add; deleted by hand, the
	// next config sync round writes it again.
	dstAdmin := kafka.NewAdmin("destination", []string{env.dst.Bootstrap()}, "test", nil)
	defer dstAdmin.Close()
	activeOnB := func() bool {
		recs, err := truncate.ActiveMirrors(ctx, dstAdmin)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Mirror == "ab" && r.Topic == topic {
				return true
			}
		}
		return false
	}
	if !activeOnB() {
		t.Fatalf("no active record of ab/%s in B's %s after the add", topic, truncate.StateTopic)
	}
	produceSync(t, kgoClient(t, env.dst), []*kgo.Record{{Topic: truncate.StateTopic, Key: []byte("active\x00ab\x00" + topic + "\x00-1")}})
	if activeOnB() {
		t.Fatal("the active record survived its tombstone")
	}
	for deadline := time.Now().Add(30 * time.Second); !activeOnB(); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the config sync round did not write the active record of ab/%s again within 30 s", topic)
		}
	}

	requireLoopRefused := func(m *member, mirror, other string, extra ...string) {
		t.Helper()
		args := append([]string{"add", "--mirror", mirror, "--topic", topic}, extra...)
		_, errOut, code := cli(t, m, args...)
		if code == 0 {
			t.Fatalf("kmirror %s: accepted; want it refused as a mirror loop", strings.Join(args, " "))
		}
		for _, want := range []string{"is itself a mirror of this destination cluster", "mirror " + other + " of the kmirror group beside the source",
			"kmirror remove --mirror " + other + " --topic " + topic} {
			if !strings.Contains(errOut, want) {
				t.Fatalf("kmirror %s refused with %q; want it to say %q", strings.Join(args, " "), errOut, want)
			}
		}
		dry := []string{"add", "--mirror", mirror, "--topic", topic, "--dry-run"} // --dry-run shows what --truncate would do
		out, errOut, code := cli(t, m, dry...)
		if !strings.Contains(out+errOut, "is itself a mirror of this destination cluster") {
			t.Fatalf("kmirror %s --dry-run (exit %d) does not show the refusal:\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
	}

	// A->B mirrors the topic: B->A on A's group would close the loop.
	requireLoopRefused(mA, "ba", "ab")
	if rows, err := mA.client.Describe(ctx, "ba", topic); err == nil && len(rows) > 0 {
		t.Fatalf("the refused add recorded the topic on mirror ba: %+v", rows)
	}
	requireSameRecords(t, readAll(t, env.src, topic, 1, true), readAll(t, env.dst, topic, 1, true))

	// Failover to B, new records there, failback B->A on A's group.
	if err := mB.client.RemoveTopic(ctx, "ab", topic); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.dst), keyedRecords(topic, 1000, 10))
	addCaughtUp(t, mA, "ba", topic)
	requireSameRecords(t, readAll(t, env.dst, topic, 1, true), readAll(t, env.src, topic, 1, true))

	// B->A mirrors it now: the old A->B, plain or --truncate, would close
	// the loop (once accepted, it echoed every record on both clusters).
	requireLoopRefused(mB, "ab", "ba")
	requireLoopRefused(mB, "ab", "ba", "--truncate")
	produceSync(t, kgoClient(t, env.dst), keyedRecords(topic, 2000, 10))
	waitCaughtUp(t, mA, "ba", topic)
	b := readAll(t, env.dst, topic, 1, true)
	if len(b[0]) != 50 {
		t.Fatalf("B's %s holds %d records, want its 30 + 10 + 10: something was echoed back", topic, len(b[0]))
	}
	requireSameRecords(t, b, readAll(t, env.src, topic, 1, true))
}

// TestActiveActive: each cluster is writable for its own topics and
// mirrors the other's: A->B for aa-a, B->A for aa-b, both groups running,
// producers on both sides at once. Both adds are accepted, each mirror
// topic equals its source record by record, and no record comes back.
func TestActiveActive(t *testing.T) {
	ctx := context.Background()
	if err := env.src.CreateTopic(ctx, "aa-a", 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := env.dst.CreateTopic(ctx, "aa-b", 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	mB := sideMember(t, "aa-beside-b", env.dst, env.src, "ab")
	mA := sideMember(t, "aa-beside-a", env.src, env.dst, "ba")
	if _, err := mB.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "ab", Topics: []string{"aa-a"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := mA.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "ba", Topics: []string{"aa-b"}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < 20; i++ {
			produceSync(t, kgoClient(t, env.src), keyedRecords("aa-a", i*50, 50))
		}
	})
	wg.Go(func() {
		for i := 0; i < 20; i++ {
			produceSync(t, kgoClient(t, env.dst), keyedRecords("aa-b", i*50, 50))
		}
	})
	wg.Wait()
	waitCaughtUp(t, mB, "ab", "aa-a")
	waitCaughtUp(t, mA, "ba", "aa-b")
	a, b := readAll(t, env.src, "aa-a", 2, true), readAll(t, env.dst, "aa-b", 2, true)
	if len(a[0])+len(a[1]) != 1000 || len(b[0])+len(b[1]) != 1000 {
		t.Fatalf("sources hold %d and %d records, want 1000 each: a mirror wrote into its own source", len(a[0])+len(a[1]), len(b[0])+len(b[1]))
	}
	requireSameRecords(t, a, readAll(t, env.dst, "aa-a", 2, true))
	requireSameRecords(t, b, readAll(t, env.src, "aa-b", 2, true))
}
