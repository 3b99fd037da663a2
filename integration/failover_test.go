package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
	"github.com/kmirror/kmirror/truncate"
)

// Failover (issue 8 section 2): remove as an emergency failover and
// remove --wait-for-sync as a planned switchover.

// stateRecords reads __kmirror_state on cl with the Kafka console
// consumer, a plain Kafka client, and returns the last mirrored position
// of each partition of topic.
func stateRecords(t *testing.T, cl *harness.Cluster, topic string) map[int32]truncate.LastMirrored {
	t.Helper()
	got := map[int32]truncate.LastMirrored{}
	for _, rec := range allStateRecords(t, cl, topic) {
		got[rec.Partition] = rec
	}
	return got
}

// allStateRecords is every __kmirror_state record of topic on cl, in order.
func allStateRecords(t *testing.T, cl *harness.Cluster, topic string) []truncate.LastMirrored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := cl.Java(ctx, "org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", cl.Bootstrap(),
		"--topic", truncate.StateTopic, "--from-beginning", "--timeout-ms", "5000",
		"--property", "print.key=true", "--property", "key.separator=\t")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run() // exits non-zero on the timeout that ends it
	var got []truncate.LastMirrored
	for _, line := range strings.Split(out.String(), "\n") {
		key, value, ok := strings.Cut(line, "\t")
		if !ok {
			continue
		}
		rec, ok, err := truncate.ParseLastMirrored([]byte(key), []byte(value))
		if err != nil {
			t.Fatalf("state record %q: %v", line, err)
		}
		if ok && rec.Topic == topic {
			got = append(got, rec)
		}
	}
	if len(got) == 0 {
		t.Fatalf("the console consumer found no %s record of %s in %s:\n%s\n%s", truncate.StateTopic, topic, out.String(), errb.String(), cl.Bootstrap())
	}
	return got
}

// requireStoppedAt checks describe and the state topic show every
// partition STOPPED at the given source and destination ends.
func requireStoppedAt(t *testing.T, m *member, mirror, topic string, srcEnd, dstEnd []int64) {
	t.Helper()
	rows, err := m.client.Describe(context.Background(), mirror, topic)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.State != "STOPPED" || r.SourceOffset != srcEnd[r.Partition] || r.DestinationOffset != dstEnd[r.Partition] {
			t.Fatalf("describe after remove: %+v, want STOPPED at source %d, destination %d", r, srcEnd[r.Partition], dstEnd[r.Partition])
		}
	}
	recs := stateRecords(t, env.dst, topic)
	for p := range srcEnd {
		rec, ok := recs[int32(p)]
		if !ok || rec.SourceOffset != srcEnd[p] || rec.DestinationOffset != dstEnd[p] || rec.Mirror != mirror ||
			rec.SourceClusterID == "" || rec.SourceTopicID == "" || rec.DestinationTopicID == "" || rec.DestinationClusterID != env.dst.ClusterID() {
			t.Fatalf("%s record of partition %d: %+v (found %t), want source %d destination %d with cluster and topic IDs",
				truncate.StateTopic, p, rec, ok, srcEnd[p], dstEnd[p])
		}
	}
}

// produceSteadily writes n records to topic on cl, one every 2 ms, until
// stop (which waits for them) is called or n are written.
func produceSteadily(t *testing.T, cl *harness.Cluster, topic string, n int) (stop func()) {
	t.Helper()
	prod := kgoClient(t, cl, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	done := make(chan struct{})
	finished := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			select {
			case <-done:
				finished <- nil
				return
			case <-time.After(2 * time.Millisecond):
			}
			pctx, cancel := context.WithTimeout(context.Background(), produceTimeout)
			err := prod.ProduceSync(pctx, &kgo.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(fmt.Sprint("steady-", i))}).FirstErr()
			cancel()
			if err != nil {
				finished <- err
				return
			}
		}
		finished <- nil
	}()
	return func() {
		t.Helper()
		close(done)
		select {
		case err := <-finished:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(produceTimeout + 30*time.Second):
			t.Fatalf("steady producer into %s: a record not acknowledged within %v", topic, produceTimeout+30*time.Second)
		}
	}
}

// TestPlannedSwitchover: remove --wait-for-sync refuses while producers
// still write to the source, then, once they stopped, waits for the
// groups and stops at the source's last stable offset; producers write to
// the destination right after.
func TestPlannedSwitchover(t *testing.T) {
	m := groupMember(t, "switchover")
	ctx := context.Background()
	const topic, partitions = "so-topic", 2
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 2000, 100_000)()
	addCaughtUp(t, m, "gs", topic)

	stop := produceSteadily(t, env.src, topic, 4000)
	out, errOut, code := cli(t, m, "remove", "--mirror", "gs", "--topic", topic, "--wait-for-sync=3s")
	if code != 1 || !strings.Contains(errOut, "did not complete within 3s") || !strings.Contains(errOut, "still MIRRORING") ||
		!strings.Contains(errOut, "stop the producers") {
		t.Fatalf("switchover while producers write: exit %d\n%s%s\n%s", code, out, errOut, m.logTail())
	}
	if rows, err := m.client.Describe(ctx, "gs", topic); err != nil || rows[0].State != "MIRRORING" {
		t.Fatalf("after the refused switchover: %+v, %v; want MIRRORING", rows, err)
	}
	stop()
	before := consoleConsume(t, env.src, topic, "so-group", "consumer", 1500)
	srcCommitted := committedByTool(t, env.src, "so-group", topic)
	start := time.Now()
	if out, errOut, code := cli(t, m, "remove", "--mirror", "gs", "--topic", topic, "--wait-for-sync=2m"); code != 0 {
		t.Fatalf("planned switchover: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("planned switchover of %d partitions took %s", partitions, time.Since(start).Round(time.Millisecond))
	srcEnd := endOffsets(t, kgoClient(t, env.src), topic, partitions, true)
	dstEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)
	requireStoppedAt(t, m, "gs", topic, srcEnd, dstEnd)
	// The topic has no holes: the translation is the identity.
	if got := committedByTool(t, env.dst, "so-group", topic); fmt.Sprint(got) != fmt.Sprint(srcCommitted) {
		t.Fatalf("destination offsets of so-group %v after the switchover, want %v", got, srcCommitted)
	}
	// Producers move to the destination; the group continues there.
	produceSync(t, kgoClient(t, env.dst, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner())),
		[]*kgo.Record{{Topic: topic, Partition: 0, Value: []byte("after switchover 0")}, {Topic: topic, Partition: 1, Value: []byte("after switchover 1")}})
	src := readAll(t, env.src, topic, partitions, true)
	total := len(src[0]) + len(src[1])
	after := consoleConsume(t, env.dst, topic, "so-group", "consumer", total-1500+2)
	// The records written after the switchover come last, once each.
	var mirrored []consumed
	lastOf := map[int32]string{}
	for _, c := range after {
		lastOf[c.partition] = c.line
		if !strings.Contains(c.line, "after switchover") {
			mirrored = append(mirrored, c)
		}
	}
	for p := int32(0); p < partitions; p++ {
		if !strings.HasSuffix(lastOf[p], fmt.Sprint("after switchover ", p)) {
			t.Fatalf("the group's last record of partition %d on the destination is %q, want the one written after the switchover", p, lastOf[p])
		}
	}
	requireExactUnion(t, src, before, mirrored)
}

// TestFailoverFinalGroupSync: an emergency remove syncs the groups once
// more after the final checkpoint, so a commit made after the last
// periodic sync reaches the destination.
func TestFailoverFinalGroupSync(t *testing.T) {
	m := startMember(t, "final-sync", memberOpts{})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "fs", Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "groups.sync.interval": "1h",
	}}); err != nil {
		t.Fatal(err)
	}
	const topic = "fs-topic"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 100))
	addCaughtUp(t, m, "fs", topic)
	time.Sleep(time.Second) // the first (immediate) sync round has passed
	commitOn(t, env.src, "fs-group", topic, map[int32]int64{0: 40})
	if got := committedByTool(t, env.dst, "fs-group", topic); len(got) != 0 {
		t.Fatalf("the destination has offsets %v before remove: the test needs a commit only the final sync carries", got)
	}
	if err := m.client.RemoveTopic(ctx, "fs", topic); err != nil {
		t.Fatal(err)
	}
	if got := committedByTool(t, env.dst, "fs-group", topic); got[0] != 40 {
		t.Fatalf("destination offsets of fs-group after remove: %v, want 40 (the final group sync)", got)
	}
	rows, err := m.client.DescribeGroups(ctx, "fs")
	if err != nil || len(rows) != 1 || rows[0].State != api.GroupSynced || rows[0].DestinationCommitted != 40 {
		t.Fatalf("describe --groups after remove: %+v, %v; want the final sync's row", rows, err)
	}
}

// TestFailoverSourceDown: the emergency case, with the source cluster
// gone: remove still stops every partition at its last mirrored
// position at once, and the destination is writable.
func TestFailoverSourceDown(t *testing.T) {
	ctx := context.Background()
	src, err := harness.Start(ctx, harness.Options{Name: "fo-source", BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	m := startMirrorMember(t, "fo-down", memberOpts{}, "fo", src)
	const topic, partitions = "fo-topic", 3
	if err := src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecordsTo(t, src, topic, 3000, 100_000)()
	addCaughtUp(t, m, "fo", topic)
	srcEnd := endOffsets(t, kgoClient(t, src), topic, partitions, true)
	if err := src.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if out, errOut, code := cli(t, m, "remove", "--mirror", "fo", "--topic", topic); code != 0 {
		t.Fatalf("remove with the source down: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("emergency failover with the source down took %s", time.Since(start).Round(time.Millisecond))
	dstEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)
	requireStoppedAt(t, m, "fo", topic, srcEnd, dstEnd)
	produceSync(t, kgoClient(t, env.dst, kgo.ProducerLinger(0), kgo.DefaultProduceTopic(topic)), []*kgo.Record{{Value: []byte("after failover")}})
}

// blockSource is the test hook that makes one member's probe of a
// mirror's source fail, as if that member alone had lost the source.
func blockSource(t *testing.T, m *member, mirror string, on bool) {
	t.Helper()
	body := fmt.Sprintf(`{"mirror": %q, "on": %t}`, mirror, on)
	resp, err := m.httpc.Post(m.url+"/v1/internal/test/block-source", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("block-source hook: status %d", resp.StatusCode)
	}
}

// unreachableSeconds reads a member's kmirror_source_unreachable_seconds.
func unreachableSeconds(t *testing.T, m *member, mirror string) float64 {
	t.Helper()
	return metricValue(t, m, fmt.Sprintf(`kmirror_source_unreachable_seconds{mirror=%q} `, mirror))
}

// TestAutomaticFailover: with failover.auto.after.ms set, one member that
// loses the source (test hook) does not fail the mirror over, however
// long; the source cluster stopping, seen by every member, does.
func TestAutomaticFailover(t *testing.T) {
	ctx := context.Background()
	src, err := harness.Start(ctx, harness.Options{Name: "af-source", BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	g := startGroup(t, "af", 3)
	m := g.members[0]
	m.src = src
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "af", Properties: map[string]string{
		"bootstrap.servers": src.Bootstrap(), "failover.auto.after.ms": "4000",
	}}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "af-topic", 3
	if err := src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecordsTo(t, src, topic, 3000, 100_000)()
	addCaughtUp(t, m, "af", topic)

	// One member loses the source for twice the threshold: no failover.
	lone := g.members[2]
	blockSource(t, lone, "af", true)
	deadline := time.Now().Add(time.Minute)
	for unreachableSeconds(t, lone, "af") < 8 {
		if time.Now().After(deadline) {
			t.Fatal("the blocked member's probe does not report the source unreachable")
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, r := range waitAllStates(t, m, "af", topic, "MIRRORING", "", 5*time.Second) {
		if r.State != "MIRRORING" {
			t.Fatalf("one member without the source failed the mirror over: %+v", r)
		}
	}
	// ...but it gives its partitions of the mirror to the members that
	// reach the source (issue 18: a member whose source link stalled kept
	// them).
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		rows, err := m.client.Describe(ctx, "af", topic)
		if err != nil {
			t.Fatal(err)
		}
		owned := 0
		for _, r := range rows {
			if r.Owner == "af-3" {
				owned++
			}
		}
		if owned == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("af-3, which cannot reach the source, still owns %d partitions after a minute: %+v", owned, rows)
		}
	}
	streamRecordsTo(t, src, topic, 300, 100_000)()
	waitCaughtUp(t, m, "af", topic)
	requireSameRecords(t, readAll(t, src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	blockSource(t, lone, "af", false)

	// The source stops: every member loses it, and the group fails over.
	srcEnd := endOffsets(t, kgoClient(t, src), topic, partitions, true)
	if err := src.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	rows := waitAllStates(t, m, "af", topic, "STOPPED", "automatic failover", 2*time.Minute)
	// Each partition stopped once: one last mirrored position each (issue
	// 18: a stop ran again while the member's state had not yet shown the
	// first one applied).
	per := map[int32]int{}
	for _, rec := range allStateRecords(t, env.dst, topic) {
		per[rec.Partition]++
	}
	for p := int32(0); p < partitions; p++ {
		if per[p] != 1 {
			t.Errorf("partition %d has %d %s records, want 1 (a stop ran more than once): %v", p, per[p], truncate.StateTopic, per)
		}
	}
	t.Logf("automatic failover done %s after the source stopped (failover.auto.after.ms=4000)", time.Since(stopped).Round(time.Millisecond))
	dstEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)
	for _, r := range rows {
		if r.SourceOffset != srcEnd[r.Partition] || r.DestinationOffset != dstEnd[r.Partition] {
			t.Fatalf("after the automatic failover: %+v, want source %d destination %d", r, srcEnd[r.Partition], dstEnd[r.Partition])
		}
	}
	failovers := 0
	for _, mm := range g.members {
		if strings.Contains(metricsText(t, mm), `kmirror_automatic_failovers_total{mirror="af"} 1`) {
			failovers++
		}
	}
	if failovers != 1 {
		t.Fatalf("%d members count the automatic failover in /metrics, want the leader alone", failovers)
	}
	produceSync(t, kgoClient(t, env.dst, kgo.ProducerLinger(0), kgo.DefaultProduceTopic(topic)), []*kgo.Record{{Value: []byte("after failover")}})
}

// TestPauseResume: a PAUSED topic keeps its lease and position and
// fetches nothing; resume continues exactly (compared record by record).
func TestPauseResume(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "paused", 2
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 1000, 100_000)()
	addCaughtUp(t, m, "src", topic)
	if out, errOut, code := cli(t, m, "pause", "--mirror", "src", "--topic", topic); code != 0 || !strings.Contains(out, "paused "+topic) {
		t.Fatalf("kmirror pause: exit %d\n%s%s", code, out, errOut)
	}
	rows := waitAllStates(t, m, "src", topic, "PAUSED", "paused by the operator", 30*time.Second)
	if out, errOut, code := cli(t, m, "pause", "--mirror", "src", "--topic", topic); code != 0 {
		t.Fatalf("pausing a PAUSED topic again: exit %d\n%s%s", code, out, errOut)
	}
	dstEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)
	owners := map[int32]string{}
	for _, r := range rows {
		owners[r.Partition] = r.Owner
		if r.Owner == "" || r.DestinationOffset != dstEnd[r.Partition] {
			t.Fatalf("paused partition %+v: want its owner kept and its position at the destination end %d", r, dstEnd[r.Partition])
		}
	}
	streamRecords(t, topic, 500, 100_000)()
	time.Sleep(2 * time.Second) // a paused topic must not move: give it time to show if it does
	if now := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false); fmt.Sprint(now) != fmt.Sprint(dstEnd) {
		t.Fatalf("destination moved from %v to %v while the topic was PAUSED", dstEnd, now)
	}
	if out, errOut, code := cli(t, m, "resume", "--mirror", "src"); code != 0 || !strings.Contains(out, "resumed "+topic) {
		t.Fatalf("kmirror resume --mirror: exit %d\n%s%s", code, out, errOut)
	}
	for _, r := range waitCaughtUp(t, m, "src", topic) {
		if r.Owner != owners[r.Partition] {
			t.Fatalf("partition %d moved from %s to %s across the pause", r.Partition, owners[r.Partition], r.Owner)
		}
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
}

// TestFailoverTime100Partitions measures an emergency failover of a
// 100-partition topic: from remove until the topic is STOPPED and a
// producer's first record is acknowledged by the destination (printed for
// the closing note, not asserted).
func TestFailoverTime100Partitions(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "failover-100", 100
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 20_000, 100_000)()
	addCaughtUp(t, m, "src", topic)
	prod := kgoClient(t, env.dst, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	start := time.Now()
	if err := m.client.RemoveTopic(ctx, "src", topic); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(start)
	if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("first write after failover")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover of %d partitions: STOPPED after %s, first destination write acknowledged after %s",
		partitions, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	waitAllStates(t, m, "src", topic, "STOPPED", "", time.Second)
}

// TestSwitchoverGroupAheadOnDestination: a group whose destination commit
// moved ahead of its source commit (consumers already read there) is a
// conflict kmirror leaves alone, but it needs nothing from a planned
// switchover: remove --wait-for-sync completes and says so, instead of
// timing out on it (issue 18).
func TestSwitchoverGroupAheadOnDestination(t *testing.T) {
	m := groupMember(t, "switchover-ahead")
	const topic = "soa-topic"
	if err := env.src.CreateTopic(context.Background(), topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 200))
	addCaughtUp(t, m, "gs", topic)
	commitOn(t, env.src, "soa-group", topic, map[int32]int64{0: 100})
	waitGroupSynced(t, m, "gs", "soa-group", topic, map[int32]int64{0: 100})
	commitOn(t, env.dst, "soa-group", topic, map[int32]int64{0: 150})
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		rows, err := m.client.DescribeGroups(context.Background(), "gs")
		if err != nil {
			t.Fatal(err)
		}
		conflict := false
		for _, r := range rows {
			conflict = conflict || (r.Group == "soa-group" && r.State == "conflict" && r.Ahead)
		}
		if conflict {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("soa-group never showed the destination ahead: %+v", rows)
		}
	}
	out, errOut, code := cli(t, m, "remove", "--mirror", "gs", "--topic", topic, "--wait-for-sync=40s")
	if code != 0 {
		t.Fatalf("planned switchover with a group ahead on the destination: exit %d\n%s%s", code, out, errOut)
	}
	if want := "note: group soa-group partition 0: the destination's commit 150 is ahead of the source's (100)"; !strings.Contains(out, want) {
		t.Fatalf("the switchover's reply does not say the group was left ahead (want %q):\n%s", want, out)
	}
	if got := committedByTool(t, env.dst, "soa-group", topic); got[0] != 150 {
		t.Fatalf("destination commit of soa-group %v after the switchover, want 150 kept", got)
	}
}
