package integration

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestStalledSourceShownStale: the source's link stalls (a proxy passes
// nothing and keeps the connections open: no RST, no FIN). describe must
// not show the partition caught up with its last offsets: it says the
// offsets are stale, since when, whose link, and the lag is unknown. Once
// the link comes back the partition mirrors on with nothing lost (issue
// 18: a stalled link showed LAG 0 and no reason).
func TestStalledSourceShownStale(t *testing.T) {
	ctx := context.Background()
	src, err := harness.Start(ctx, harness.Options{Name: "source-stalled", Proxy: true, BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	m := startMember(t, "stalled-source", memberOpts{})
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "st", Properties: map[string]string{"bootstrap.servers": src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic = "stall-topic"
	if err := src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 100))
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "st", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	waitMirroredTo(t, m, "st", topic, 100)

	src.Proxy(0).Stall(true)
	rows := waitAllStates(t, m, "st", topic, "MIRRORING", "stale: source offset as of", 60*time.Second)
	if rows[0].Lag != -1 {
		t.Fatalf("stalled partition shows lag %d, want unknown (-1): %+v", rows[0].Lag, rows[0])
	}
	requireAll(t, rows[0].Reason, "owner stalled-source has waited", "for the source leader to answer a fetch", "the lag is unknown")
	out, _, code := cli(t, m, "describe", "--mirror", "st")
	if code != 0 {
		t.Fatalf("describe: exit %d\n%s", code, out)
	}
	requireAll(t, out, "stale: source offset as of")

	src.Proxy(0).Stall(false)
	produceSync(t, kgoClient(t, src, kgo.ProducerLinger(0)), keyedRecords(topic, 100, 50))
	if row := waitMirroredTo(t, m, "st", topic, 150); row.Reason != "" {
		t.Fatalf("after the link came back: %+v; want no reason", row)
	}
	requireSameRecords(t, readAll(t, src, topic, 1, true), readAll(t, env.dst, topic, 1, true))
}

// waitMirroredTo waits until partition 0 of topic is MIRRORING with lag 0
// at destination offset end (a source other than the shared one).
func waitMirroredTo(t *testing.T, m *member, mirror, topic string, end int64) api.PartitionStatus {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 1 && rows[0].State == "MIRRORING" && rows[0].Lag == 0 && rows[0].DestinationOffset == end {
			return rows[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not mirrored to offset %d within 60s: %+v\n%s", topic, end, rows, m.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
