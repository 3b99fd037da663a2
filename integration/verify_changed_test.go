package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestVerifyFindsChangedRecord (issue 22, section 4): a record changed
// behind kmirror's back on the destination, written with kmirror's own
// producer identity and next sequence just before kmirror copies the
// source's record there. The broker takes kmirror's copy for a retry of
// that batch (idempotence matches sequences, not contents) and answers
// with the changed record's offset, so the data path cannot notice. The
// one-off `kmirror verify` finds it in full and in sampled mode (exit 1,
// both offsets named), and the background verifier, full or sampled,
// makes the partition DIVERGED with the offsets.
func TestVerifyFindsChangedRecord(t *testing.T) {
	m := startMember(t, "verifychanged", memberOpts{})
	ctx := context.Background()
	modes := map[string]string{"vco": "off", "vcf": "full", "vcs": "sampled"}
	for mirror, mode := range modes {
		props := map[string]string{"bootstrap.servers": env.src.Bootstrap(), "verify.mode": mode, "verify.records.per.sec": "100000"}
		if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: props}); err != nil {
			t.Fatal(err)
		}
		topic := "verify-changed-" + mode
		if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
		produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 3))
		addCaughtUp(t, m, mirror, topic)
		// The source's record and the changed copy share key, headers
		// and timestamp: only the value differs.
		next := keyedRecords(topic, 3, 1)
		next[0].Timestamp = time.Now().Truncate(time.Millisecond)
		changeNextRecord(t, env.dst, next[0], 3, "changed behind kmirror's back")
		produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), next)
	}

	// The one-off check, on the mirror whose background verifier is off:
	// the data path took kmirror's copy as written at offset 3.
	waitMirroredTo(t, m, "vco", "verify-changed-off", 4)
	for _, mode := range [][]string{{"--full"}, {"--samples", "40"}} {
		out, errOut, code := cli(t, m, append([]string{"--output", "json", "verify", "--mirror", "vco", "--topic", "verify-changed-off"}, mode...)...)
		var rows []api.VerifyPartition
		if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 {
			t.Fatalf("verify %v: exit %d, not a report of 1 partition: %v\n%s%s", mode, code, err, out, errOut)
		}
		if r := rows[0]; code != 1 || !strings.Contains(r.Mismatch, "value differs") || r.MismatchSource != 3 || r.MismatchDestination != 3 {
			t.Fatalf("verify %v of a changed record: exit %d, %+v; want exit 1 and the value differing at source and destination offset 3", mode, code, r)
		}
	}
	// A compacted topic is not verified (compaction on either side would
	// misalign the pairs): said by the one-off check and noted by the
	// background verifier, the partition left MIRRORING.
	const compacted = "verify-compacted"
	if err := env.src.CreateTopic(ctx, compacted, 1, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(compacted, 0, 5))
	addCaughtUp(t, m, "vcf", compacted)
	out, errOut, code := cli(t, m, "verify", "--mirror", "vcf", "--topic", compacted, "--full")
	if code != 1 || !strings.Contains(out, "not compared: compacted topic (cleanup.policy=compact on the source)") {
		t.Fatalf("verify of a compacted topic: exit %d\n%s%s", code, out, errOut)
	}
	rows := waitRows(t, m, "vcf", compacted, "note of a compacted topic", func(p api.PartitionStatus) bool {
		return strings.Contains(p.VerifyNote, "compacted topic") && strings.Contains(p.Reason, "compacted topic")
	})
	if rows[0].State != "MIRRORING" || rows[0].VerifiedRecords != 0 {
		t.Fatalf("compacted topic under verify.mode=full: %+v; want MIRRORING and nothing compared", rows[0])
	}

	// The background verifier, in both modes.
	for mirror, mode := range modes {
		if mode == "off" {
			continue
		}
		topic := "verify-changed-" + mode
		rows := waitRows(t, m, mirror, topic, "DIVERGED partition", func(p api.PartitionStatus) bool { return p.State == "DIVERGED" })
		if r := rows[0]; !strings.Contains(r.Reason, "source offset 3, destination offset 3: value differs") {
			t.Fatalf("verify.mode=%s: DIVERGED with reason %q (mismatch %q); want the differing value at offset 3 named", mode, r.Reason, r.VerifyMismatch)
		}
	}
}

// changeNextRecord writes, into partition 0 of rec's topic on the
// destination at offset next, rec (the record kmirror will copy next)
// with value instead of its own, under kmirror's producer identity and
// its next sequence (as DescribeProducers shows them), so that kmirror's
// copy is answered as a retry of it.
func changeNextRecord(t *testing.T, dst *harness.Cluster, rec *kgo.Record, next int, value string) {
	t.Helper()
	topic := rec.Topic
	// Produce v13 (Kafka 4.1) names topics by ID: the request is kept at
	// 4.0's versions, which name them.
	c := kgoClient(t, dst, kgo.MaxVersions(kversion.V4_0_0()))
	req := kmsg.NewPtrDescribeProducersRequest()
	rt := kmsg.NewDescribeProducersRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{0}
	req.Topics = append(req.Topics, rt)
	var producers []kmsg.DescribeProducersResponseTopicPartitionActiveProducer
	for _, sh := range c.RequestSharded(context.Background(), req) {
		if sh.Err != nil {
			t.Fatalf("describe producers of %s: %v", topic, sh.Err)
		}
		for _, tt := range sh.Resp.(*kmsg.DescribeProducersResponse).Topics {
			for _, p := range tt.Partitions {
				producers = append(producers, p.ActiveProducers...)
			}
		}
	}
	if len(producers) != 1 {
		t.Fatalf("destination %s/0 has %d active producers, want kmirror's alone: %+v", topic, len(producers), producers)
	}
	pr := producers[0]
	kr := kwire.Record{Timestamp: rec.Timestamp.UnixMilli(), Key: rec.Key, Value: []byte(value)}
	for _, h := range rec.Headers {
		kr.Headers = append(kr.Headers, kwire.Header{Key: h.Key, Value: h.Value})
	}
	b, err := kwire.EncodeBatch([]kwire.Record{kr}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Rewrite(pr.ProducerID, int16(pr.ProducerEpoch), pr.LastSequence+1)
	preq := kmsg.NewPtrProduceRequest()
	preq.Acks, preq.TimeoutMillis = -1, 10_000
	pt := kmsg.NewProduceRequestTopic()
	pt.Topic = topic
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Partition, pp.Records = 0, b
	pt.Partitions = append(pt.Partitions, pp)
	preq.Topics = append(preq.Topics, pt)
	resp, err := c.Request(context.Background(), preq)
	if err != nil {
		t.Fatalf("produce the changed record: %v", err)
	}
	p := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0]
	if p.ErrorCode != 0 || p.BaseOffset != int64(next) {
		t.Fatalf("produce the changed record: error %d at offset %d, want offset %d", p.ErrorCode, p.BaseOffset, next)
	}
	t.Logf("%s: wrote a changed record at offset %d as producer %d epoch %d sequence %d", topic, next, pr.ProducerID, pr.ProducerEpoch, pr.LastSequence+1)
}
