package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// Failback (issue 8 section 4): cluster A is the shared source, B the
// shared destination. A kmirror member beside B mirrors A->B; one beside A
// (its destination is A) mirrors the topic back after a failover.

// sideMember starts a member whose destination is dst, with mirror name
// from the cluster src.
func sideMember(t *testing.T, name string, dst, src *harness.Cluster, mirror string) *member {
	t.Helper()
	o := memberOpts{}
	if dst != env.dst {
		o.destination = dst.Bootstrap()
	}
	m := startMirrorMember(t, name, o, mirror, src)
	m.src = src
	return m
}

// syncingMember is sideMember with its mirror syncing groups every 300 ms.
func syncingMember(t *testing.T, name string, dst, src *harness.Cluster, mirror string) *member {
	t.Helper()
	m := sideMember(t, name, dst, src, mirror)
	if err := m.client.AlterMirror(context.Background(), api.CreateMirrorRequest{Name: mirror, Properties: map[string]string{
		"bootstrap.servers": src.Bootstrap(), "groups.sync.interval": "300ms"}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// fetchedBytes reads a member's kmirror_source_fetched_bytes_total of a mirror.
func fetchedBytes(t *testing.T, m *member, mirror string) int64 {
	t.Helper()
	prefix := fmt.Sprintf(`kmirror_source_fetched_bytes_total{mirror=%q} `, mirror)
	for _, line := range strings.Split(metricsText(t, m), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q", line)
			}
			return int64(f)
		}
	}
	return 0
}

// recordBytes sums what the records of src from offsets from[p] take
// (key, value and headers): the least a copy of them must fetch.
func recordBytes(src [][]*kgo.Record, from []int64) int64 {
	var n int64
	for p, recs := range src {
		for _, r := range recs {
			if r.Offset >= from[p] {
				n += int64(len(r.Key) + len(r.Value))
				for _, h := range r.Headers {
					n += int64(len(h.Key) + len(h.Value))
				}
			}
		}
	}
	return n
}

// produceTo writes n keyed records, tagged, to every partition of topic on cl.
func produceTo(t *testing.T, cl *harness.Cluster, topic string, partitions, n int, tag string) {
	t.Helper()
	c := kgoClient(t, cl, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchCompression(kgo.NoCompression()))
	pad := strings.Repeat("x", 1000) // records large next to batch overhead, for the fetched-bytes check
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(fmt.Sprint(tag, "-k", i)),
			Value: []byte(fmt.Sprint(tag, "-", i, "-", pad)), Headers: []kgo.RecordHeader{{Key: "tag", Value: []byte(tag)}}})
	}
	produceSync(t, c, recs)
}

// TestFailbackRoundTrip: A->B, failover to B, new writes on B, mirror
// B->A (clean failback: only the new records are fetched, A equals B),
// failover to A, new writes on A, mirror A->B again: B equals A. A
// consumer group follows every move, reading every record exactly once.
func TestFailbackRoundTrip(t *testing.T) {
	ctx := context.Background()
	const topic, partitions, group = "fb-round", 2, "fb-round-group"
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 400, "a1")
	mB := syncingMember(t, "fb-beside-b", env.dst, env.src, "ab")
	addCaughtUp(t, mB, "ab", topic)
	var reads []consumed
	reads = append(reads, consoleConsume(t, env.src, topic, group, "consumer", 150)...)
	waitGroupSynced(t, mB, "ab", group, topic, committedByTool(t, env.src, group, topic))

	// Failover to B; producers and the group move there.
	if err := mB.client.RemoveTopic(ctx, "ab", topic); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.dst, topic, partitions, 300, "b1")
	reads = append(reads, consoleConsume(t, env.dst, topic, group, "consumer", 400)...)

	// Failback: a member beside A mirrors B->A.
	mA := syncingMember(t, "fb-beside-a", env.src, env.dst, "ba")
	out, errOut, code := cli(t, mA, "add", "--mirror", "ba", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "failback from mirror ab: continue") {
		t.Fatalf("add --dry-run of the failback: exit %d\n%s%s", code, out, errOut)
	}
	aEnd := endOffsets(t, kgoClient(t, env.src), topic, partitions, false)
	bEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)
	bRecs := readAll(t, env.dst, topic, partitions, true)
	before := fetchedBytes(t, mA, "ba")
	start := time.Now()
	addCaughtUp(t, mA, "ba", topic)
	t.Logf("clean failback: add to caught up in %s", time.Since(start).Round(time.Millisecond))
	fetched := fetchedBytes(t, mA, "ba") - before
	// B's records below its failover position are A's: only the new ones
	// (from B's end at the failover) are fetched.
	stopped, err := mB.client.Describe(ctx, "ab", topic)
	if err != nil {
		t.Fatal(err)
	}
	from := make([]int64, partitions)
	for _, r := range stopped {
		from[r.Partition] = r.DestinationOffset
	}
	newBytes, allBytes := recordBytes(bRecs, from), recordBytes(bRecs, make([]int64, partitions))
	t.Logf("clean failback fetched %d bytes; the new records on B take %d bytes, all of B's records %d", fetched, newBytes, allBytes)
	if fetched < newBytes || fetched >= newBytes+(allBytes-newBytes)/2 {
		t.Fatalf("clean failback fetched %d bytes: want about the %d bytes of the new records, far below the %d of all records", fetched, newBytes, allBytes)
	}
	requireSameRecords(t, readAll(t, env.dst, topic, partitions, true), readAll(t, env.src, topic, partitions, true))
	for p := range aEnd {
		if got := endOffsets(t, kgoClient(t, env.src), topic, partitions, false)[p]; got != aEnd[p]+(bEnd[p]-from[p]) {
			t.Fatalf("A's partition %d grew from %d to %d: want only B's %d new records", p, aEnd[p], got, bEnd[p]-from[p])
		}
	}
	// The group's commit on B reaches A, translated.
	waitGroupSynced(t, mA, "ba", group, topic, committedByTool(t, env.dst, group, topic))

	// Failover to A; writes on A; the group moves back to A.
	if err := mA.client.RemoveTopic(ctx, "ba", topic); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 200, "a2")
	reads = append(reads, consoleConsume(t, env.src, topic, group, "consumer", 300)...)

	// And A->B again, through the first member.
	out, errOut, code = cli(t, mB, "add", "--mirror", "ab", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "failback from mirror ba: continue") {
		t.Fatalf("add --dry-run of the round trip: exit %d\n%s%s", code, out, errOut)
	}
	addCaughtUp(t, mB, "ab", topic)
	final := readAll(t, env.src, topic, partitions, true)
	requireSameRecords(t, final, readAll(t, env.dst, topic, partitions, true))
	waitGroupSynced(t, mB, "ab", group, topic, committedByTool(t, env.src, group, topic))
	total := len(final[0]) + len(final[1])
	reads = append(reads, consoleConsume(t, env.dst, topic, group, "consumer", total-len(reads))...)
	requireExactUnion(t, final, reads[:1], reads[1:])
}

// recordsFrom returns the records of each partition at or after from[p].
func recordsFrom(recs [][]*kgo.Record, from []int64) [][]*kgo.Record {
	out := make([][]*kgo.Record, len(recs))
	for p := range recs {
		for _, r := range recs[p] {
			if r.Offset >= from[p] {
				out[p] = append(out[p], r)
			}
		}
	}
	return out
}

// stoppedAt returns the destination (or source) offsets describe shows for
// a STOPPED topic.
func stoppedAt(t *testing.T, m *member, mirror, topic string, partitions int, destination bool) []int64 {
	t.Helper()
	rows, err := m.client.Describe(context.Background(), mirror, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, partitions)
	for _, r := range rows {
		if r.State != "STOPPED" {
			t.Fatalf("partition %d is %s, want STOPPED", r.Partition, r.State)
		}
		out[r.Partition] = r.SourceOffset
		if destination {
			out[r.Partition] = r.DestinationOffset
		}
	}
	return out
}

// TestFailbackDivergent: records written to A after B's last fetch make
// the failback refuse, with the count per partition; --dry-run shows the
// plan; --truncate moves exactly those records into a quarantine topic,
// rebuilds A as a copy of B, and the group lands exactly on A.
func TestFailbackDivergent(t *testing.T) {
	ctx := context.Background()
	const topic, partitions, group = "fb-div", 2, "fb-div-group"
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 300, "a1")
	mB := sideMember(t, "fd-beside-b", env.dst, env.src, "fdab")
	addCaughtUp(t, mB, "fdab", topic)
	reads := consoleConsume(t, env.src, topic, group, "classic", 100)
	waitGroupSynced(t, mB, "fdab", group, topic, committedByTool(t, env.src, group, topic))
	if err := mB.client.RemoveTopic(ctx, "fdab", topic); err != nil {
		t.Fatal(err)
	}
	lastMirrored := stoppedAt(t, mB, "fdab", topic, partitions, false)
	produceTo(t, env.src, topic, partitions, 7, "late") // written to A after the failover: 4 + 3
	late := recordsFrom(readAll(t, env.src, topic, partitions, true), lastMirrored)
	produceTo(t, env.dst, topic, partitions, 50, "b1")
	reads = append(reads, consoleConsume(t, env.dst, topic, group, "classic", 120)...)

	mA := sideMember(t, "fd-beside-a", env.src, env.dst, "fdba")
	_, errOut, code := cli(t, mA, "add", "--mirror", "fdba", "--topic", topic)
	for _, want := range []string{"has 7 records past the last mirrored position", "partition 0: 4", "partition 1: 3", "--truncate"} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Fatalf("failback onto divergent records: exit %d, want 1 with %q:\n%s", code, want, errOut)
		}
	}
	out, errOut, code := cli(t, mA, "add", "--mirror", "fdba", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "refused without --truncate") || !strings.Contains(out, "--truncate would copy the 7 divergent records") {
		t.Fatalf("add --dry-run: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := cli(t, mA, "add", "--mirror", "fdba", "--topic", topic, "--truncate"); code != 0 {
		t.Fatalf("add --truncate: exit %d\n%s%s", code, out, errOut)
	}
	requireSameRecords(t, late, readAll(t, env.src, topic+".kmirror-diverged.1", partitions, true))
	waitCaughtUp(t, mA, "fdba", topic)
	final := readAll(t, env.dst, topic, partitions, true)
	requireSameRecords(t, final, readAll(t, env.src, topic, partitions, true))
	waitGroupSynced(t, mA, "fdba", group, topic, committedByTool(t, env.dst, group, topic))
	total := len(final[0]) + len(final[1])
	reads = append(reads, consoleConsume(t, env.src, topic, group, "classic", total-len(reads))...)
	requireExactUnion(t, final, reads[:1], reads[1:])
}

// TestReAddStoppedTopic: a topic removed and added again in the same
// direction continues from its last mirrored position (also after its
// mirror was deleted and created again under another name); writes made
// on the destination in between are divergent: refused, or quarantined
// with --truncate and the topic rebuilt.
func TestReAddStoppedTopic(t *testing.T) {
	ctx := context.Background()
	const topic, partitions = "readd", 2
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 200, "a1")
	m := sideMember(t, "readd", env.dst, env.src, "ra")
	addCaughtUp(t, m, "ra", topic)
	if err := m.client.RemoveTopic(ctx, "ra", topic); err != nil {
		t.Fatal(err)
	}
	// The source broker restarts meanwhile: its leader epoch moves on,
	// which the epoch of the last mirrored batch must account for (a
	// new-user trial found a continued topic wrongly DIVERGED at its
	// second re-add: the resume took epoch 0 for it).
	if err := env.src.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := env.src.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 100, "a2")
	before := fetchedBytes(t, m, "ra")
	addCaughtUp(t, m, "ra", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	if got := fetchedBytes(t, m, "ra") - before; got > 200*1100 {
		t.Fatalf("re-adding fetched %d bytes: more than the 100 new records", got)
	}

	// The mirror is deleted and created under another name: the topic is
	// still recognised as kmirror's.
	if err := m.client.RemoveTopic(ctx, "ra", topic); err != nil {
		t.Fatal(err)
	}
	if err := m.client.DeleteMirror(ctx, "ra", false); err != nil {
		t.Fatal(err)
	}
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "ra2", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 20, "a3")
	addCaughtUp(t, m, "ra2", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))

	// Writes on the destination after a stop diverge.
	if err := m.client.RemoveTopic(ctx, "ra2", topic); err != nil {
		t.Fatal(err)
	}
	lastMirrored := stoppedAt(t, m, "ra2", topic, partitions, true)
	produceTo(t, env.dst, topic, partitions, 5, "b-late")
	late := recordsFrom(readAll(t, env.dst, topic, partitions, true), lastMirrored)
	_, errOut, code := cli(t, m, "add", "--mirror", "ra2", "--topic", topic)
	if code != 1 || !strings.Contains(errOut, "has 5 records past the last mirrored position") || !strings.Contains(errOut, "re-add") {
		t.Fatalf("re-add onto divergent records: exit %d\n%s", code, errOut)
	}
	// A destination group's positions survive the truncation, also when
	// a first --truncate was refused for a group with members (a fresh-
	// user trial lost one: the refused attempt had already forgotten the
	// old translation that maps them).
	srcStop := stoppedAt(t, m, "ra2", topic, partitions, false)
	commitOn(t, env.dst, "readd-app", topic, map[int32]int64{0: 50, 1: lastMirrored[1] + 2})
	live := liveGroup(t, env.dst, "readd-live", topic)
	if out, errOut, code := cli(t, m, "add", "--mirror", "ra2", "--topic", topic, "--truncate"); code != 1 || !strings.Contains(out+errOut, "readd-live") {
		t.Fatalf("add --truncate with a live group on the destination: exit %d, want 1 naming readd-live\n%s%s", code, out, errOut)
	}
	live.Close()
	if out, errOut, code := cli(t, m, "add", "--mirror", "ra2", "--topic", topic, "--truncate"); code != 0 {
		t.Fatalf("add --truncate: exit %d\n%s%s", code, out, errOut)
	}
	requireSameRecords(t, late, readAll(t, env.dst, topic+".kmirror-diverged.1", partitions, true))
	waitCaughtUp(t, m, "ra2", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	want := map[int32]int64{}
	for p, o := range map[int32]int64{0: 50, 1: srcStop[1]} { // destination 50 was source 50: plain records keep offsets
		tr, err := m.client.Translate(ctx, "ra2", topic, p, o)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = tr.DestinationOffset
	}
	waitCommitted(t, env.dst, "readd-app", topic, want)
}

// TestFailbackAfterUncleanElection: A's leader took records that were
// mirrored to B, then A lost them in an unclean leader election and its
// new leader wrote as many other records at the same offsets. A's log ends
// exactly at the last mirrored position, so offsets alone call the
// failback clean: the recorded leader epoch of the last mirrored batch,
// checked against A's epoch history (OffsetForLeaderEpoch), finds the
// replaced records divergent, and --truncate quarantines them.
func TestFailbackAfterUncleanElection(t *testing.T) {
	ctx := context.Background()
	a2 := startUncleanCluster(t, "fb-unclean")
	const topic = "fb-unclean"
	if err := a2.CreateTopic(ctx, topic, 1, 2, nil); err != nil {
		t.Fatal(err)
	}
	mB := sideMember(t, "fu-beside-b", env.dst, a2, "fuab")
	produceSync(t, kgoClient(t, a2), keyedRecords(topic, 0, 10))
	addCaughtUp(t, mB, "fuab", topic)
	leader := partitionLeader(t, a2, topic)
	li, fi := int(leader-1), int(2-leader) // brokers are nodes 1 and 2
	if err := a2.StopBroker(ctx, fi); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, a2), keyedRecords(topic, 10, 20)) // on the leader only
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := mB.client.Describe(ctx, "fuab", topic)
		if err != nil {
			t.Fatal(err)
		}
		if r := rows[0]; r.DestinationOffset == 30 && r.Lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not mirrored to 30 with the follower down: %+v", rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := mB.client.RemoveTopic(ctx, "fuab", topic); err != nil {
		t.Fatal(err)
	}

	// A loses offsets 10..29 and writes 20 others there.
	if err := a2.KillBroker(li); err != nil {
		t.Fatal(err)
	}
	if err := a2.StartBroker(ctx, fi); err != nil {
		t.Fatal(err)
	}
	electUnclean(t, a2, topic, int32(fi+1))
	produceSync(t, kgoClient(t, a2), keyedRecords(topic, 1000, 20))
	if err := a2.StartBroker(ctx, li); err != nil { // back as a follower: it truncates to the new leader
		t.Fatal(err)
	}
	replaced := recordsFrom(readAll(t, a2, topic, 1, true), []int64{10})
	if end := endOffsets(t, kgoClient(t, a2), topic, 1, false)[0]; end != 30 || len(replaced[0]) != 20 {
		t.Fatalf("A's log ends at %d with %d records from offset 10; the test needs 30 and 20", end, len(replaced[0]))
	}
	produceTo(t, env.dst, topic, 1, 5, "b1")

	mA := sideMember(t, "fu-beside-a", a2, env.dst, "fuba")
	_, errOut, code := cli(t, mA, "add", "--mirror", "fuba", "--topic", topic)
	if code != 1 || !strings.Contains(errOut, "partition 0: 20 (offsets 10..29)") {
		t.Fatalf("failback onto records an unclean election replaced: exit %d\n%s", code, errOut)
	}
	out, _, code := cli(t, mA, "add", "--mirror", "fuba", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "unclean leader election") {
		t.Fatalf("add --dry-run does not name the unclean election: exit %d\n%s", code, out)
	}
	if out, errOut, code := cli(t, mA, "add", "--mirror", "fuba", "--topic", topic, "--truncate"); code != 0 {
		t.Fatalf("add --truncate: exit %d\n%s%s", code, out, errOut)
	}
	requireSameRecords(t, replaced, readAll(t, a2, topic+".kmirror-diverged.1", 1, true))
	waitCaughtUp(t, mA, "fuba", topic)
	requireSameRecords(t, readAll(t, env.dst, topic, 1, true), readAll(t, a2, topic, 1, true))
}
