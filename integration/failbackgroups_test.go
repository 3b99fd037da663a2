package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestFailbackKeepsGroupPositions (issue 21, section 4): A->B, failover to
// B, records written to A after it (divergent) and on B. Groups that
// committed only on A keep their positions through add --truncate of the
// failback: clamped to the truncation point and translated into the
// rebuilt topic, so a consumer reads exactly B's new records (not the
// whole topic again, as with auto.offset.reset=earliest, nor none, as with
// latest). A group that also committed on B takes B's position. While a
// group with members has committed on the topic, --truncate is refused,
// naming it.
func TestFailbackKeepsGroupPositions(t *testing.T) {
	ctx := context.Background()
	const topic, partitions, shared = "fb-groups", 2, "fbg-shared"
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 400, "a1")
	mB := syncingMember(t, "fg-beside-b", env.dst, env.src, "fgab")
	addCaughtUp(t, mB, "fgab", topic)
	consoleConsume(t, env.src, topic, shared, "classic", 100)
	waitGroupSynced(t, mB, "fgab", shared, topic, committedByTool(t, env.src, shared, topic))
	if err := mB.client.RemoveTopic(ctx, "fgab", topic); err != nil {
		t.Fatal(err)
	}
	lastA := stoppedAt(t, mB, "fgab", topic, partitions, false) // A's offsets at the failover
	lastB := stoppedAt(t, mB, "fgab", topic, partitions, true)  // and B's
	produceTo(t, env.src, topic, partitions, 10, "late")        // divergent on A
	produceTo(t, env.dst, topic, partitions, 60, "b1")
	consoleConsume(t, env.dst, topic, shared, "classic", 50) // the shared group moves on on B
	endA := endOffsets(t, kgoClient(t, env.src), topic, partitions, false)
	// Groups that only ever read A: one at A's end (past the truncation
	// point), one in the middle of partition 0.
	commitOn(t, env.src, "fbg-a-end", topic, map[int32]int64{0: endA[0], 1: endA[1]})
	commitOn(t, env.src, "fbg-a-mid", topic, map[int32]int64{0: 40})
	// A group with a live member on A.
	live := liveGroup(t, env.src, "fbg-live", topic)

	mA := syncingMember(t, "fg-beside-a", env.src, env.dst, "fgba")
	out, errOut, code := cli(t, mA, "add", "--mirror", "fgba", "--topic", topic, "--dry-run")
	for _, want := range []string{"--truncate is refused now", "fbg-live (Stable)", fmt.Sprint("fbg-a-end partition 0 at ", lastA[0]),
		"fbg-a-mid partition 0 at 40"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("add --dry-run: exit %d, want %q in\n%s%s", code, want, out, errOut)
		}
	}
	out, errOut, code = cli(t, mA, "add", "--mirror", "fgba", "--topic", topic, "--truncate")
	if code != 1 || !strings.Contains(out+errOut, "fbg-live (Stable)") || !strings.Contains(out+errOut, "Nothing was truncated") {
		t.Fatalf("add --truncate with a live group on A: exit %d, want 1 naming fbg-live\n%s%s", code, out, errOut)
	}
	if got := endOffsets(t, kgoClient(t, env.src), topic, partitions, false); got[0] != endA[0] || got[1] != endA[1] {
		t.Fatalf("the refused truncation changed A's topic: ends %v, were %v", got, endA)
	}
	live.Close() // leaves the group: Empty
	liveAt := committedByTool(t, env.src, "fbg-live", topic)

	out, errOut, code = cli(t, mA, "add", "--mirror", "fgba", "--topic", topic, "--truncate")
	if code != 0 || !strings.Contains(out, "consumer group positions on "+topic+" kept") {
		t.Fatalf("add --truncate: exit %d\n%s%s", code, out, errOut)
	}
	waitCaughtUp(t, mA, "fgba", topic)
	final := readAll(t, env.src, topic, partitions, true)
	requireSameRecords(t, readAll(t, env.dst, topic, partitions, true), final)

	// Each A-only group gets its A position back, clamped to the
	// truncation point, at the exact translation of the B offset it was
	// copied to (A -> B kept offsets, as the test's plain records do).
	translated := func(bOffsets map[int32]int64) map[int32]int64 {
		want := map[int32]int64{}
		for p, o := range bOffsets {
			tr, err := mA.client.Translate(ctx, "fgba", topic, p, o)
			if err != nil {
				t.Fatalf("translate %s/%d offset %d: %v", topic, p, o, err)
			}
			want[p] = tr.DestinationOffset
		}
		return want
	}
	liveB := map[int32]int64{}
	for p, o := range liveAt {
		liveB[p] = min(o, lastA[p]) + lastB[p] - lastA[p]
	}
	for group, want := range map[string]map[int32]int64{
		"fbg-a-end": translated(map[int32]int64{0: lastB[0], 1: lastB[1]}),
		"fbg-a-mid": translated(map[int32]int64{0: 40 + lastB[0] - lastA[0]}),
		"fbg-live":  translated(liveB),
	} {
		waitCommitted(t, env.src, group, topic, want)
	}
	// The shared group committed on B too: B's position wins.
	waitGroupSynced(t, mA, "fgba", shared, topic, committedByTool(t, env.dst, shared, topic))
	waitNoRestoreRows(t, mA, "fgba")

	// fbg-a-end reads exactly what B wrote after the failover.
	want := translated(map[int32]int64{0: lastB[0], 1: lastB[1]})
	n := 0
	for p := range final {
		n += len(final[p]) - int(want[int32(p)])
	}
	got := consoleConsume(t, env.src, topic, "fbg-a-end", "classic", n)
	next := map[int32]int64{0: want[0], 1: want[1]}
	for _, c := range got {
		r := final[c.partition][next[c.partition]]
		if c.offset != r.Offset || c.line != printed(r) {
			t.Fatalf("fbg-a-end read partition %d offset %d %q, want offset %d %q", c.partition, c.offset, c.line, r.Offset, printed(r))
		}
		next[c.partition]++
	}
}

// liveGroup starts a consumer of topic in group on cl that has read and
// committed some records and stays a member (the group is Stable) until
// the returned client is closed.
func liveGroup(t *testing.T, cl *harness.Cluster, group, topic string) *kgo.Client {
	t.Helper()
	live := kgoClient(t, cl, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if fs := live.PollRecords(ctx, 10); fs.Err() != nil {
		t.Fatalf("consumer of group %s: poll: %v", group, fs.Err())
	}
	if err := live.CommitUncommittedOffsets(ctx); err != nil {
		t.Fatalf("consumer of group %s: commit: %v", group, err)
	}
	return live
}

// waitCommitted waits until group's committed offsets of topic on the
// cluster equal want.
func waitCommitted(t *testing.T, c *harness.Cluster, group, topic string, want map[int32]int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := committedByTool(t, c, group, topic)
		same := len(got) == len(want)
		for p, o := range want {
			same = same && got[p] == o
		}
		if same {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s committed %v on %s, want %v", group, got, topic, want)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitNoRestoreRows waits until describe --groups of mirror shows no row
// giving back a kept position: each given back and cleared from raft (a
// kept one shows a row every round, synced or not).
func waitNoRestoreRows(t *testing.T, m *member, mirror string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := m.client.DescribeGroups(context.Background(), mirror)
		if err != nil {
			t.Fatal(err)
		}
		var left []api.GroupStatus
		for _, r := range rows {
			if r.Restore {
				left = append(left, r)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kept group positions not given back within a minute: %+v", left)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
