package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// Topics changing under the mirror (issue 7): each test is one kind of
// fault with its right outcome, checked record by record on real Kafka.

// TestHazardPartitionsAdded: a source topic grown from 2 to 4 partitions
// while mirrored. The destination grows to 4 and the new partitions are
// mirrored from their start, record by record.
func TestHazardPartitionsAdded(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-grow"
	if err := env.src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 50))
	addCaughtUp(t, m, "src", topic)
	createPartitions(t, env.src, topic, 4)
	// A new client: it sees the four partitions at once.
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 50, 200))
	waitPartitions(t, m, "src", topic, 4)
	waitCaughtUp(t, m, "src", topic)
	src := readAll(t, env.src, topic, 4, true)
	if len(src[2])+len(src[3]) == 0 {
		t.Fatalf("no record went to the added partitions: the test proves nothing")
	}
	requireSameRecords(t, src, readAll(t, env.dst, topic, 4, true))
}

// TestHazardSourceTopicRecreated: a mirrored source topic deleted (FAILED
// with that reason after a bounded wait) and created again under the same
// name (DIVERGED: a new topic ID); the destination keeps exactly the old
// records and nothing of the new topic.
func TestHazardSourceTopicRecreated(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-recreate"
	if err := env.src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 50))
	addCaughtUp(t, m, "src", topic)
	old := readAll(t, env.src, topic, 2, true)
	requireSameRecords(t, old, readAll(t, env.dst, topic, 2, true))

	deleteTopic(t, env.src, topic)
	waitAllStates(t, m, "src", topic, "FAILED", "source topic "+topic+" no longer exists", 90*time.Second)
	recreateTopic(t, env.src, topic, 2)
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 1000, 80))
	waitAllStates(t, m, "src", topic, "DIVERGED", "source topic "+topic+" was recreated", time.Minute)
	requireSameRecords(t, old, readAll(t, env.dst, topic, 2, true))
	// describe --failed (KIP-1279's view): both partitions, since when,
	// and two failures each (FAILED, then DIVERGED).
	out, errOut, code := cli(t, m, "--output", "json", "describe", "--failed", "--mirror", "src", "--topic", topic)
	var failed []api.PartitionStatus
	if code != 0 || json.Unmarshal([]byte(out), &failed) != nil || len(failed) != 2 {
		t.Fatalf("describe --failed: exit %d, want the 2 DIVERGED partitions\n%s%s", code, out, errOut)
	}
	for _, r := range failed {
		if r.State != "DIVERGED" || r.Failures != 2 || time.Since(time.UnixMilli(r.StateSinceMs)) > 2*time.Minute {
			t.Fatalf("describe --failed row %+v: want DIVERGED, 2 failures, since the last minutes", r)
		}
	}
	if _, err := m.client.Translate(ctx, "src", topic, 0, 0); err == nil {
		t.Fatalf("translate answered for a partition whose source topic was recreated")
	}
	// The way on the reason gives: remove, delete the destination topic,
	// add again. The new topic is mirrored from its start.
	if _, stderr, code := cli(t, m, "remove", "--mirror", "src", "--topic", topic); code != 0 {
		t.Fatalf("remove: %s", stderr)
	}
	if _, stderr, code := cli(t, m, "add", "--mirror", "src", "--topic", topic); code == 0 || !strings.Contains(stderr, "delete it on the destination cluster first") {
		t.Fatalf("add while the old destination topic exists: exit %d, %q; want a refusal saying to delete it", code, stderr)
	}
	deleteTopic(t, env.dst, topic)
	deadline := time.Now().Add(time.Minute)
	for {
		_, stderr, code := cli(t, m, "add", "--mirror", "src", "--topic", topic)
		if code == 0 {
			break
		}
		if !strings.Contains(stderr, "delete it on the destination cluster first") || time.Now().After(deadline) {
			t.Fatalf("add again after remove: %s", stderr)
		}
		time.Sleep(500 * time.Millisecond) // the deletion is still finishing
	}
	waitCaughtUp(t, m, "src", topic)
	requireSameRecords(t, readAll(t, env.src, topic, 2, true), readAll(t, env.dst, topic, 2, true))
}

// TestHazardEffectiveConfigs: the source brokers accept 6 MiB records
// (message.max.bytes as a cluster-wide broker config, nothing set on the
// topic); the destination brokers 4 MiB. The destination topic gets the
// source topic's effective max.message.bytes, so a 5 MiB record is
// mirrored.
func TestHazardEffectiveConfigs(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-bigrecord"
	alterBrokerDefault(t, env.src, "message.max.bytes", "6291456")
	t.Cleanup(func() { alterBrokerDefault(t, env.src, "message.max.bytes", "") })
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	if got := topicConfig(t, env.src, topic, "max.message.bytes"); got != "6291456" {
		t.Fatalf("source topic max.message.bytes = %s, want the broker-wide 6291456", got)
	}
	big := make([]byte, 5<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	c := kgoClient(t, env.src, kgo.ProducerBatchMaxBytes(6<<20), kgo.ProducerBatchCompression(kgo.NoCompression()))
	produceSync(t, c, []*kgo.Record{{Topic: topic, Key: []byte("small"), Value: []byte("before")}})
	produceSync(t, c, []*kgo.Record{{Topic: topic, Key: []byte("big"), Value: big}})
	produceSync(t, c, []*kgo.Record{{Topic: topic, Key: []byte("small"), Value: []byte("after")}})
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	if got := topicConfig(t, env.dst, topic, "max.message.bytes"); got != "6291456" {
		t.Fatalf("destination topic max.message.bytes = %s, want the source's effective 6291456", got)
	}
	waitCaughtUp(t, m, "src", topic)
	requireSameRecords(t, readAll(t, env.src, topic, 1, true), readAll(t, env.dst, topic, 1, true))
}

// TestHazardDestinationRetention: destination retention deletes records
// kmirror wrote past its last checkpoint, then kmirror is killed. The
// resume is not a divergence: it maps the deleted offsets to their source
// records and mirrors on (MIRRORING at 21/21).
func TestHazardDestinationRetention(t *testing.T) {
	// Checkpoints an hour apart: the kill always lands before one.
	m := startMirrorMember(t, "hz-retention", memberOpts{checkpoint: "1h"}, "hzret", env.src)
	ctx := context.Background()
	const topic = "hz-retention"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	recs := keyedRecords(topic, 0, 20)
	for _, r := range recs {
		r.Timestamp = time.Now().Add(-48 * time.Hour)
	}
	produceSync(t, kgoClient(t, env.src), recs)
	addCaughtUp(t, m, "hzret", topic)
	// What retention.ms would do to these 48-hour-old records on the
	// destination, without waiting for the broker's retention check.
	deleteRecords(t, env.dst, topic, 0, 20)
	m.kill9()
	m.start()
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 20, 1))
	rows := waitCaughtUp(t, m, "hzret", topic)
	if r := rows[0]; r.State != "MIRRORING" || r.SourceOffset != 21 || r.DestinationOffset != 21 {
		t.Fatalf("after the resume: %+v, want MIRRORING at 21/21", r)
	}
	src := readAll(t, env.src, topic, 1, true)
	requireSameRecords(t, [][]*kgo.Record{src[0][20:]}, readAll(t, env.dst, topic, 1, true))
	tr, err := m.client.Translate(ctx, "hzret", topic, 0, 20)
	if err != nil || tr.DestinationOffset != 20 {
		t.Fatalf("translate(20) = %+v, %v; want 20", tr, err)
	}
}

// TestHazardSourceGap: source records deleted before they were mirrored
// (the member was down). The partition stops DIVERGED with the exact range
// and the source log start, describe keeps its position, list shows the
// mirror DIVERGED; resume --accept-gap records the gap, counts it in
// describe and /metrics, and mirrors on with an exact translation.
func TestHazardSourceGap(t *testing.T) {
	m := startMirrorMember(t, "hz-gap", memberOpts{}, "hzgap", env.src)
	ctx := context.Background()
	const topic = "hz-gap"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	sc := kgoClient(t, env.src)
	produceSync(t, sc, keyedRecords(topic, 0, 100))
	addCaughtUp(t, m, "hzgap", topic)
	before := readAll(t, env.src, topic, 1, true)
	m.stop()
	produceSync(t, sc, keyedRecords(topic, 100, 50))
	deleteRecords(t, env.src, topic, 0, 150)
	produceSync(t, sc, keyedRecords(topic, 150, 10))
	m.start()

	r := waitAllStates(t, m, "hzgap", topic, "DIVERGED", "source offsets 100..149", time.Minute)[0]
	if !strings.Contains(r.Reason, "the source log starts at 150") || !strings.Contains(r.Reason, "--accept-gap") {
		t.Fatalf("reason %q does not give the source log start and the way on", r.Reason)
	}
	if r.DestinationOffset != 100 {
		t.Fatalf("describe of the DIVERGED partition: destination offset %d, want 100 (its position)", r.DestinationOffset)
	}
	mirrors, err := m.client.ListMirrors(ctx)
	if err != nil || len(mirrors) != 1 || mirrors[0].State != "DIVERGED" {
		t.Fatalf("list = %+v, %v; want mirror hzgap DIVERGED", mirrors, err)
	}
	// More is deleted after the operator read the reason: accepting that
	// gap accepts 100..149, not the larger one. DIVERGED again, naming it.
	deleteRecords(t, env.src, topic, 0, 152)
	out, stderr, code := cli(t, m, "resume", "--mirror", "hzgap", "--topic", topic, "--accept-gap")
	if code != 0 || !strings.Contains(out, "resumed partitions 0") {
		t.Fatalf("kmirror resume --accept-gap: exit %d, %q %q", code, out, stderr)
	}
	waitAllStates(t, m, "hzgap", topic, "DIVERGED", "source offsets 100..151", time.Minute)
	if r, _ := m.client.Describe(ctx, "hzgap", topic); r[0].SkippedRecords != 0 || !strings.Contains(r[0].Reason, "more was deleted since") {
		t.Fatalf("a gap larger than the one accepted: %+v; want DIVERGED again, nothing skipped", r[0])
	}
	if out, stderr, code = cli(t, m, "resume", "--mirror", "hzgap", "--topic", topic, "--accept-gap"); code != 0 {
		t.Fatalf("second kmirror resume --accept-gap: exit %d, %q %q", code, out, stderr)
	}
	rows := waitCaughtUp(t, m, "hzgap", topic)
	if rows[0].SkippedRecords != 52 || rows[0].LastGap != "100..151" || !strings.Contains(rows[0].Reason, "skipped 52") {
		t.Fatalf("describe after accepting the gap: %+v; want 52 skipped records, gap 100..151", rows[0])
	}
	want := `kmirror_partition_skipped_records_total{mirror="hzgap",partition="0",topic="hz-gap"} 52`
	if metrics := metricsText(t, m); !strings.Contains(metrics, want) {
		t.Fatalf("/metrics lacks %s", want)
	}
	after := readAll(t, env.src, topic, 1, true)
	if len(after[0]) != 8 || after[0][0].Offset != 152 {
		t.Fatalf("source holds %d records from offset %d, want 8 from 152", len(after[0]), after[0][0].Offset)
	}
	requireSameRecords(t, [][]*kgo.Record{append(before[0], after[0]...)}, readAll(t, env.dst, topic, 1, true))
	for _, c := range []struct{ src, dst int64 }{{99, 99}, {100, 100}, {120, 100}, {152, 100}, {155, 103}, {160, 108}} {
		tr, err := m.client.Translate(ctx, "hzgap", topic, 0, c.src)
		if err != nil || tr.DestinationOffset != c.dst {
			t.Fatalf("translate(%d) = %+v, %v; want %d", c.src, tr, err, c.dst)
		}
	}
	// A second resume has nothing to do, and says so without failing.
	if got, err := m.client.ResumePartitions(ctx, api.ResumeRequest{Mirror: "hzgap", Topic: topic}); err != nil || len(got) != 0 {
		t.Fatalf("resume of a mirroring topic: %v, %v; want nothing resumed and no error", got, err)
	}
}

// TestHazardOpenTransaction: a caught-up partition whose source holds
// records of an open transaction says so in describe (LAG 0 alone would
// hide them), and mirrors them once the transaction commits.
func TestHazardOpenTransaction(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-opentxn"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 5))
	tc := kgoClient(t, env.src, kgo.TransactionalID("hz-opentxn"))
	if err := tc.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, r := range keyedRecords(topic, 5, 3) {
		if err := tc.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	r := waitAllStates(t, m, "src", topic, "MIRRORING", "waiting for an open source transaction", time.Minute)[0]
	if r.Lag != 0 || !strings.Contains(r.Reason, "source offsets 5..7") {
		t.Fatalf("describe while a transaction is open: %+v; want lag 0 and offsets 5..7 named", r)
	}
	if err := tc.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	// The coordinator writes the commit marker after EndTxn answers: wait
	// until the source's last stable offset is past it.
	deadline := time.Now().Add(30 * time.Second)
	for endOffsets(t, kgoClient(t, env.src), topic, 1, true)[0] < 9 {
		if time.Now().After(deadline) {
			t.Fatal("the source's last stable offset never passed the commit marker")
		}
		time.Sleep(100 * time.Millisecond)
	}
	rows := waitCaughtUp(t, m, "src", topic)
	if rows[0].Reason != "" {
		t.Fatalf("describe after the commit: reason %q, want none", rows[0].Reason)
	}
	requireSameRecords(t, readAll(t, env.src, topic, 1, true), readAll(t, env.dst, topic, 1, true))
}

// TestHazardKeylessCompacted: 10 keyless and 10 keyed records written
// while the source topic was cleanup.policy=delete, then the topic made
// compact and 5 more keyed records. Every record a source consumer reads
// arrives on the destination, and the destination topic ends up compacted
// like its source once the backlog is mirrored.
func TestHazardKeylessCompacted(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-keyless"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, map[string]string{"cleanup.policy": "delete"}); err != nil {
		t.Fatal(err)
	}
	sc := kgoClient(t, env.src)
	var recs []*kgo.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Value: []byte(fmt.Sprintf("keyless-%d", i))})
	}
	produceSync(t, sc, append(recs, keyedRecords(topic, 0, 10)...))
	alterTopicConfig(t, env.src, topic, "cleanup.policy", "compact")
	produceSync(t, sc, keyedRecords(topic, 10, 5))
	addCaughtUp(t, m, "src", topic)
	src := readAll(t, env.src, topic, 1, true)
	if len(src[0]) != 25 || src[0][0].Key != nil {
		t.Fatalf("source holds %d records (first key %q): the test needs the 25 with keyless ones first", len(src[0]), src[0][0].Key)
	}
	requireSameRecords(t, src, readAll(t, env.dst, topic, 1, true))
	deadline := time.Now().Add(time.Minute)
	for topicConfig(t, env.dst, topic, "cleanup.policy") != "compact" {
		if time.Now().After(deadline) {
			t.Fatalf("destination topic never got cleanup.policy=compact after the backlog was mirrored:\n%s", m.logTail())
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Mirroring goes on under compaction.
	produceSync(t, sc, keyedRecords(topic, 15, 5))
	waitCaughtUp(t, m, "src", topic)
	requireSameRecords(t, readAll(t, env.src, topic, 1, true), readAll(t, env.dst, topic, 1, true))
}

// TestHazardCompactedHoles: a compacted source partition of 60,001
// offsets in which 30,000 records each follow a hole (the log cleaner
// removed the older value of every key) needs a breakpoint per record.
// The translation is written as delta-encoded segments that fit the
// offsets topic, so checkpoints succeed (nothing to retry in describe), a
// kill -9 resumes from the checkpoint without re-walking, translation is
// exact after the restart, and remove stops the topic.
func TestHazardCompactedHoles(t *testing.T) {
	m := startMirrorMember(t, "hz-holes", memberOpts{}, "hzholes", env.src)
	ctx := context.Background()
	const topic, n = "hz-holes", 30_000
	if err := env.src.CreateTopic(ctx, topic, 1, 1, map[string]string{
		"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001", "min.compaction.lag.ms": "0",
	}); err != nil {
		t.Fatal(err)
	}
	sc := kgoClient(t, env.src, kgo.ProducerLinger(0))
	var recs []*kgo.Record
	for i := 0; i < n; i++ {
		k := []byte(fmt.Sprintf("key-%d", i))
		recs = append(recs, &kgo.Record{Topic: topic, Key: k, Value: []byte("old")}, &kgo.Record{Topic: topic, Key: k, Value: []byte(fmt.Sprint("new-", i))})
	}
	produceSync(t, sc, recs)
	time.Sleep(200 * time.Millisecond) // segment.ms passes: the next record rolls the segment
	produceSync(t, sc, []*kgo.Record{{Topic: topic, Key: []byte("last"), Value: []byte("rolls the segment")}})
	deadline := time.Now().Add(3 * time.Minute)
	var src [][]*kgo.Record
	for {
		src = readAll(t, env.src, topic, 1, true)
		if len(src[0]) == n+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source's log cleaner left %d records, want %d", len(src[0]), n+1)
		}
		time.Sleep(2 * time.Second)
	}
	for i, r := range src[0][:n] {
		if r.Offset != int64(2*i+1) {
			t.Fatalf("record %d at source offset %d, want %d: the holes are not where the test needs them", i, r.Offset, 2*i+1)
		}
	}
	rows := addCaughtUp(t, m, "hzholes", topic)
	requireSameRecords(t, src, readAll(t, env.dst, topic, 1, true))
	// The leader applies the deferred compaction configs within its 3 s
	// topic check, and checkpoints are written every round: no reason left.
	for deadline := time.Now().Add(15 * time.Second); rows[0].Reason != "" && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		rows = waitAllStates(t, m, "hzholes", topic, "MIRRORING", "", time.Second)
	}
	if rows[0].Reason != "" {
		t.Fatalf("describe after catching up: %+v; want no reason (checkpoints written, compaction configs applied)", rows)
	}
	if metrics := metricsText(t, m); !strings.Contains(metrics, `kmirror_partition_checkpoint_failing{mirror="hzholes",partition="0",topic="hz-holes"} 0`) {
		t.Fatal("/metrics does not show the partition's checkpoint as written")
	}
	m.kill9()
	m.start()
	waitCaughtUp(t, m, "hzholes", topic)
	for _, l := range logLines(t, m, "partition resumed") {
		if l.Walked != 0 {
			t.Fatalf("a resume walked %d records: the checkpoint was not written", l.Walked)
		}
	}
	for _, o := range []int64{0, 1, 2, 3, 4, 31_337, 59_999, 60_000, 60_001} {
		want := (o) / 2
		if o > 2*n-1 {
			want = int64(n) + o - int64(2*n)
		}
		tr, err := m.client.Translate(ctx, "hzholes", topic, 0, o)
		if err != nil || tr.DestinationOffset != want {
			t.Fatalf("translate(%d) after the restart = %+v, %v; want %d", o, tr, err, want)
		}
	}
	if err := m.client.RemoveTopic(ctx, "hzholes", topic); err != nil {
		t.Fatalf("remove: %v", err)
	}
}

// TestHazardUncleanLeaderElection: a 2-broker source with
// unclean.leader.election.enable. The follower is stopped, 20 more records
// are written to the leader alone and mirrored, then the leader dies and
// the out-of-sync follower is made leader (an unclean election): the
// source lost offsets 10..29 that the destination holds. kmirror asks the
// new leader where the mirrored leader epoch ends (OffsetForLeaderEpoch),
// stops the partition DIVERGED with that exact range, and writes none of
// the records the new leader takes at those offsets.
func TestHazardUncleanLeaderElection(t *testing.T) {
	ctx := context.Background()
	src2 := startUncleanCluster(t, "source-unclean")
	m := startMirrorMember(t, "hz-unclean", memberOpts{}, "hzunclean", src2)
	const topic = "hz-unclean"
	if err := src2.CreateTopic(ctx, topic, 1, 2, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src2), keyedRecords(topic, 0, 10))
	addCaughtUp(t, m, "hzunclean", topic)
	leader := partitionLeader(t, src2, topic)
	if leader < 1 {
		t.Fatalf("no leader for %s", topic)
	}
	li, fi := int(leader-1), int(2-leader) // brokers are nodes 1 and 2
	if err := src2.StopBroker(ctx, fi); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src2), keyedRecords(topic, 10, 20))
	// (waitCaughtUp's offset lookups would dial the stopped broker.)
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := m.client.Describe(ctx, "hzunclean", topic)
		if err != nil {
			t.Fatal(err)
		}
		if r := rows[0]; r.State == "MIRRORING" && r.DestinationOffset == 30 && r.Lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not mirrored to 30 with the follower down: %+v", rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// (Reading the source now could dial the stopped broker: the
	// destination is checked against what was produced.)
	mirrored := readAll(t, env.dst, topic, 1, true)
	if len(mirrored[0]) != 30 {
		t.Fatalf("destination holds %d records, want 30", len(mirrored[0]))
	}
	for i, r := range mirrored[0] {
		if want := fmt.Sprintf("key-%d", i); string(r.Key) != want || string(r.Value) != fmt.Sprintf("value-%d", i) {
			t.Fatalf("destination record %d is %q=%q, want %s", i, r.Key, r.Value, want)
		}
	}

	if err := src2.KillBroker(li); err != nil {
		t.Fatal(err)
	}
	if err := src2.StartBroker(ctx, fi); err != nil {
		t.Fatal(err)
	}
	electUnclean(t, src2, topic, int32(fi+1))
	// The new leader takes offsets 10..34 with other records: past what
	// was mirrored, so only the epoch check can tell them from new data.
	produceSync(t, kgoClient(t, src2), keyedRecords(topic, 1000, 25))
	r := waitAllStates(t, m, "hzunclean", topic, "DIVERGED", "the source lost offsets 10..29", 2*time.Minute)[0]
	if !strings.Contains(r.Reason, "unclean leader election") {
		t.Fatalf("reason %q does not name the cause", r.Reason)
	}
	requireSameRecords(t, mirrored, readAll(t, env.dst, topic, 1, true))
}

// TestHazardDestinationTopicRecreated: the destination topic of an idle
// partition is deleted and created again by someone else. kmirror checks the
// destination topic ID before producing: the partition stops DIVERGED
// and nothing is written into the new topic.
func TestHazardDestinationTopicRecreated(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-dst-recreate"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	sc := kgoClient(t, env.src)
	produceSync(t, sc, keyedRecords(topic, 0, 10))
	addCaughtUp(t, m, "src", topic)
	// The partition idles: the case of an operator recreating a topic
	// between batches (within destinationVerifyGap of a batch, only the
	// leader's periodic check would see it: README, current limits).
	time.Sleep(time.Second)
	deleteTopic(t, env.dst, topic)
	recreateTopic(t, env.dst, topic, 1)
	produceSync(t, sc, keyedRecords(topic, 10, 10))
	waitAllStates(t, m, "src", topic, "DIVERGED", "destination topic "+topic+" was recreated", time.Minute)
	if got := readAll(t, env.dst, topic, 1, false); len(got[0]) != 0 {
		t.Fatalf("kmirror wrote %d records into the recreated destination topic", len(got[0]))
	}
}

// TestHazardSourceRecreatedWhileStopped: the case as reported: 50 records
// mirrored, the daemon stopped, the source topic recreated with 80 new
// records, the daemon started. The resume finds the new topic ID: DIVERGED
// with that reason, the destination still holds exactly the old 50, and
// translate does not answer with the old topic's offsets.
func TestHazardSourceRecreatedWhileStopped(t *testing.T) {
	m := startMirrorMember(t, "hz-recreate-stopped", memberOpts{}, "hzstopped", env.src)
	ctx := context.Background()
	const topic = "hz-recreate-stopped"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 50))
	addCaughtUp(t, m, "hzstopped", topic)
	old := readAll(t, env.dst, topic, 1, true)
	m.stop()
	deleteTopic(t, env.src, topic)
	recreateTopic(t, env.src, topic, 1)
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 2000, 80))
	m.start()
	waitAllStates(t, m, "hzstopped", topic, "DIVERGED", "source topic "+topic+" was recreated", time.Minute)
	requireSameRecords(t, old, readAll(t, env.dst, topic, 1, true))
	if len(old[0]) != 50 {
		t.Fatalf("destination held %d records before the restart, want 50", len(old[0]))
	}
	if tr, err := m.client.Translate(ctx, "hzstopped", topic, 0, 0); err == nil {
		t.Fatalf("translate(0) answered %+v for a recreated source topic", tr)
	}
}

// TestHazardDestinationTopicDeleted: the destination topic of an idle,
// caught-up partition is deleted. After a bounded wait the partition is
// FAILED with "destination topic ... no longer exists", not MIRRORING with
// lag 0 forever.
func TestHazardDestinationTopicDeleted(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "hz-dst-deleted"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 5))
	addCaughtUp(t, m, "src", topic)
	deleteTopic(t, env.dst, topic)
	waitAllStates(t, m, "src", topic, "FAILED", "destination topic "+topic+" no longer exists", 90*time.Second)
}
