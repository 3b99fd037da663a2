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

// Kafka versions on the source side (issue 21): the source runs an older
// release, started by the harness from Maven Central's jars; the
// destination is the default (4.1.1). Each ends in a record-by-record
// comparison.

// startOldSource starts a one-broker source cluster of version (in
// ZooKeeper mode when zk) and a member mirroring it as mirror name.
func startOldSource(t *testing.T, version string, zk bool, name string) (*harness.Cluster, *member) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	src, err := harness.Start(ctx, harness.Options{Name: name, KafkaVersion: version, ZooKeeper: zk, BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	m := startMember(t, name, memberOpts{})
	m.src = src
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: name, Properties: map[string]string{"bootstrap.servers": src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	return src, m
}

// legacyRecords are n keyed records without headers (message format v0/v1
// has none), with distinct timestamps.
func legacyRecords(topic string, from, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	for i := range recs {
		k := from + i
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%d", k)), Value: []byte(fmt.Sprintf("value-%d", k)),
			Timestamp: base.Add(time.Duration(k) * time.Millisecond)}
	}
	recs[0].Key = nil // a null key
	return recs
}

// TestMirrorFromKafka28LegacyFormat: a Kafka 2.8.2 source in ZooKeeper
// mode with a topic in message format v1 (message.format.version
// 0.10.2: the broker stores v1 messages, which Kafka 4.x refuses to take:
// KIP-724), written uncompressed, with gzip and with lz4: every record is
// mirrored into 4.1.1, equal record by record (offsets, keys, values,
// timestamps), the backlog and records written while it mirrors, and the
// conversion is counted in describe and /metrics. Before, both partitions
// FAILED on the first v1 message ("declares 38 bytes").
func TestMirrorFromKafka28LegacyFormat(t *testing.T) {
	src, m := startOldSource(t, "2.8.2", true, "old28")
	ctx := context.Background()
	const topic = "legacy-v1"
	if err := src.CreateTopic(ctx, topic, 2, 1, map[string]string{"message.format.version": "0.10.2"}); err != nil {
		t.Fatal(err)
	}
	write := func(from int, codec kgo.CompressionCodec) {
		// Not idempotent: v1 has no producer IDs (UNSUPPORTED_FOR_MESSAGE_FORMAT).
		c := kgoClient(t, src, kgo.ProducerBatchCompression(codec), kgo.RecordPartitioner(kgo.RoundRobinPartitioner()), kgo.DisableIdempotentWrite())
		produceSync(t, c, legacyRecords(topic, from, 500))
		c.Close()
	}
	write(0, kgo.NoCompression())
	write(500, kgo.GzipCompression())
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "old28", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	write(1000, kgo.Lz4Compression())
	write(1500, kgo.SnappyCompression())
	rows := waitCaughtUp(t, m, "old28", topic)
	requireSameRecords(t, readAll(t, src, topic, 2, true), readAll(t, env.dst, topic, 2, true))
	var converted int64
	for _, r := range rows {
		converted += r.ConvertedRecords
		if r.State != "MIRRORING" || !strings.Contains(r.Reason, "converted") {
			t.Errorf("partition %d: %s %q, want MIRRORING naming the conversion", r.Partition, r.State, r.Reason)
		}
	}
	if converted != 2000 {
		t.Fatalf("describe counts %d converted records, want 2000", converted)
	}
	text := metricsText(t, m)
	if !strings.Contains(text, `kmirror_partition_converted_records_total{mirror="old28",partition="0",topic="legacy-v1"}`) {
		t.Fatalf("/metrics lacks the converted records counter:\n%s", grepLines(text, "converted"))
	}

	// A consumer group's offsets on the 2.8.2 source reach the destination
	// translated exactly (ListGroups, OffsetFetch and OffsetCommit of an
	// older broker).
	committed := map[int32]int64{0: 300, 1: 777}
	commitOn(t, src, "old-app", topic, committed)
	want := waitGroupSynced(t, m, "old28", "old-app", topic, committed)
	if got := committedByTool(t, env.dst, "old-app", topic); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the destination's group offsets %v, want %v", got, want)
	}
	// A v2 topic of the same 2.8.2 source, through the core checks.
	compatCore(t, src, env.dst, m, "old28")
}

// TestMirrorFromKafka39KRaft: a Kafka 3.9.1 KRaft source (message format
// v2) mirrors into 4.1.1 as the default pair does, with nothing converted.
func TestMirrorFromKafka39KRaft(t *testing.T) {
	src, m := startOldSource(t, "3.9.1", false, "old39")
	ctx := context.Background()
	const topic = "from39"
	if err := src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	c := kgoClient(t, src, kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	produceSync(t, c, keyedRecords(topic, 0, 1000))
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "old39", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	produceSync(t, c, keyedRecords(topic, 1000, 1000))
	rows := waitCaughtUp(t, m, "old39", topic)
	requireSameRecords(t, readAll(t, src, topic, 2, true), readAll(t, env.dst, topic, 2, true))
	for _, r := range rows {
		if r.ConvertedRecords != 0 {
			t.Errorf("partition %d: %d records converted from a v2 source", r.Partition, r.ConvertedRecords)
		}
	}
	compatCore(t, src, env.dst, m, "old39")
}

// TestMirrorFromKafka44Into39: the newest release as the source (4.4.0
// KRaft) and an older destination (3.9.1 KRaft, the last with
// ZooKeeper): backlog and live copy, lz4, equal record by record (headers
// included), read-only topic creation and checkpoints on the older
// destination.
func TestMirrorFromKafka44Into39(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dst, err := harness.Start(ctx, harness.Options{Name: "dst39", KafkaVersion: "3.9.1", BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	src, err := harness.Start(ctx, harness.Options{Name: "src44", KafkaVersion: "4.4.0", BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	m := startMember(t, "into39", memberOpts{destination: dst.Bootstrap()})
	m.src = src
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "new44", Properties: map[string]string{"bootstrap.servers": src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic = "from44"
	if err := src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	c := kgoClient(t, src, kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	produceSync(t, c, keyedRecords(topic, 0, 1000))
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "new44", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	produceSync(t, c, keyedRecords(topic, 1000, 1000))
	waitCaughtUp(t, m, "new44", topic)
	requireSameRecords(t, readAll(t, src, topic, 2, true), readAll(t, dst, topic, 2, true))
	compatCore(t, src, dst, m, "new44")
	shareGroupUnsupported(t, src, m, "new44")
}

// grepLines returns the lines of text holding s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// compatCore runs the core checks on a pair (issue 21): a backlog and a
// live copy (zstd, then lz4), transactions with one aborted, a kill -9 of
// the member mid-copy, and a consumer group handed over by remove
// --wait-for-sync; each ends in a record-by-record comparison, and the
// group's offsets on the destination are its source commits translated
// (kmirror translate), past the aborted transaction's hole.
func compatCore(t *testing.T, src, dst *harness.Cluster, m *member, mirror string) {
	t.Helper()
	ctx := context.Background()
	topic := mirror + "-core"
	if err := src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src, kgo.ProducerBatchCompression(kgo.ZstdCompression())), keyedRecords(topic, 0, 2000))
	produceTransactions(t, src, topic, 10_000, 100, kgo.TryCommit, kgo.TryAbort, kgo.TryCommit)
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirror, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	live := kgoClient(t, src, kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	for i := 0; i < 10; i++ {
		produceSync(t, live, keyedRecords(topic, 20_000+i*200, 200))
		if i == 4 {
			m.kill9()
			m.start()
		}
	}
	// Partition growth on the source: the new partition is mirrored from
	// its start.
	createPartitions(t, src, topic, 3)
	produceSync(t, kgoClient(t, src), keyedRecords(topic, 30_000, 300))
	waitPartitions(t, m, mirror, topic, 3)
	waitCaughtUp(t, m, mirror, topic)
	requireSameRecords(t, readAll(t, src, topic, 3, true), readAll(t, dst, topic, 3, true))

	// Offsets past the aborted transaction: its records are not copied,
	// so the translation shifts them.
	end := endOffsets(t, kgoClient(t, src), topic, 3, true)
	committed := map[int32]int64{0: 1000, 1: end[1] - 10}
	commitOn(t, src, mirror+"-app", topic, committed)
	want := map[int32]int64{}
	for p, off := range committed {
		res, err := m.client.Translate(ctx, mirror, topic, p, off)
		if err != nil {
			t.Fatal(err)
		}
		want[p] = res.DestinationOffset
	}
	if out, errOut, code := cli(t, m, "remove", "--mirror", mirror, "--topic", topic, "--wait-for-sync=2m"); code != 0 {
		t.Fatalf("remove --wait-for-sync: exit %d\n%s%s", code, out, errOut)
	}
	if got := committedByTool(t, dst, mirror+"-app", topic); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the handover the destination's group offsets are %v, want the source's %v translated: %v", got, committed, want)
	}
	requireSameRecords(t, readAll(t, src, topic, 3, true), readAll(t, dst, topic, 3, true))

	// Failback: writes on the destination after the failover, mirrored
	// back by a member beside the old source (only those are copied).
	produceSync(t, kgoClient(t, dst, kgo.ProducerBatchCompression(kgo.Lz4Compression())), keyedRecords(topic, 40_000, 300))
	back := startMember(t, mirror+"-back", memberOpts{destination: src.Bootstrap()})
	back.src = dst
	if err := back.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirror + "-back", Properties: map[string]string{"bootstrap.servers": dst.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := cli(t, back, "add", "--mirror", mirror+"-back", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "failback from mirror "+mirror+": continue") {
		t.Fatalf("add --dry-run of the failback: exit %d\n%s%s", code, out, errOut)
	}
	addCaughtUp(t, back, mirror+"-back", topic)
	requireSameRecords(t, readAll(t, dst, topic, 3, true), readAll(t, src, topic, 3, true))
}

// TestMirrorFromKafka39ZooKeeper: a Kafka 3.9.1 source in ZooKeeper mode
// into 4.1.1, through the core checks.
func TestMirrorFromKafka39ZooKeeper(t *testing.T) {
	src, m := startOldSource(t, "3.9.1", true, "zk39")
	compatCore(t, src, env.dst, m, "zk39")
}

// TestMirrorFromKafka44Into44: the newest release on both sides, through
// the core checks.
func TestMirrorFromKafka44Into44(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var cls [2]*harness.Cluster
	for i, name := range []string{"src44b", "dst44b"} {
		cl, err := harness.Start(ctx, harness.Options{Name: name, KafkaVersion: "4.4.0", BrokerProps: brokerProps})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		cls[i] = cl
	}
	m := startMember(t, "into44", memberOpts{destination: cls[1].Bootstrap()})
	m.src = cls[0]
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "new44b", Properties: map[string]string{"bootstrap.servers": cls[0].Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	compatCore(t, cls[0], cls[1], m, "new44b")
	shareGroupSwitchover(t, cls[0], cls[1], m, "new44b")
}

// produceTransactions writes one transaction of n keyed records per end
// (commit or abort) into topic on cl, keys from `from` on, 100 apart.
func produceTransactions(t *testing.T, cl *harness.Cluster, topic string, from, n int, ends ...kgo.TransactionEndTry) {
	t.Helper()
	ctx := context.Background()
	txn := kgoClient(t, cl, kgo.TransactionalID(topic+"-txn"), kgo.DefaultProduceTopic(topic))
	for i, end := range ends {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, r := range keyedRecords(topic, from+i*100, n) {
			txn.Produce(ctx, r, nil)
		}
		if err := txn.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := txn.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
	}
}
