package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// waitState polls describe until partition 0 of topic reaches state, and
// returns its row.
func waitState(t *testing.T, m *member, mirror, topic, state string) api.PartitionStatus {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var last []api.PartitionStatus
	for time.Now().Before(deadline) {
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		if err != nil {
			t.Fatal(err)
		}
		last = rows
		if len(rows) > 0 && rows[0].State == state {
			return rows[0]
		}
		<-time.After(100 * time.Millisecond)
	}
	t.Fatalf("%s never reached %s: %+v\n%s", topic, state, last, m.logTail())
	return api.PartitionStatus{}
}

func metricsText(t *testing.T, m *member) string {
	t.Helper()
	return httpGet(t, m.httpc, m.url+"/metrics")
}

// TestForeignWriteDiverges writes into a mirrored destination partition
// behind kmirror's back: while it runs and sends, while it runs idle (the
// source gets nothing more), and while it is stopped. Each is detected, the partition goes DIVERGED with the reason shown in
// describe, the divergence is counted in /metrics, and kmirror does not
// write past the foreign record.
func TestForeignWriteDiverges(t *testing.T) {
	m := startMember(t, "diverge", memberOpts{})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "dsrc", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"foreign-live", "foreign-walk", "foreign-idle"} {
		if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "dsrc", Topics: []string{"foreign-live", "foreign-walk", "foreign-idle"}}); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, "foreign-live", 1000, 100_000)()
	streamRecords(t, "foreign-walk", 1000, 100_000)()
	streamRecords(t, "foreign-idle", 1000, 100_000)()
	waitCaughtUp(t, m, "dsrc", "foreign-live", "foreign-walk", "foreign-idle")

	// While idle: the idle check finds a record past what kmirror wrote and
	// past the source's end; after the retries a source leader change
	// would need, it is a divergence (it once stayed MIRRORING, retrying
	// for ever, and blocked remove).
	produceSync(t, kgoClient(t, env.dst, kgo.DefaultProduceTopic("foreign-idle")), []*kgo.Record{{Value: []byte("foreign")}})
	row := waitState(t, m, "dsrc", "foreign-idle", "DIVERGED")
	if !strings.Contains(row.Reason, "beyond the source's committed data") || !strings.Contains(row.Reason, "Another producer has written") {
		t.Fatalf("reason %q does not say what happened", row.Reason)
	}

	// While mirroring: the next kmirror batch lands after the foreign record.
	produceSync(t, kgoClient(t, env.dst, kgo.DefaultProduceTopic("foreign-live")), []*kgo.Record{{Value: []byte("foreign")}})
	streamRecords(t, "foreign-live", 10, 100_000)()
	row = waitState(t, m, "dsrc", "foreign-live", "DIVERGED")
	if !strings.Contains(row.Reason, "Another producer has written") {
		t.Fatalf("reason %q does not say what happened", row.Reason)
	}
	// The batch that revealed the foreign write has landed (a write is seen
	// only in its answer); nothing more may.
	dc := kgoClient(t, env.dst)
	stoppedAt := endOffsets(t, dc, "foreign-live", 1, false)[0]
	streamRecords(t, "foreign-live", 100, 100_000)()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); <-time.After(100 * time.Millisecond) {
		if end := endOffsets(t, dc, "foreign-live", 1, false)[0]; end != stoppedAt {
			t.Fatalf("destination grew from %d to %d: kmirror kept writing after the divergence", stoppedAt, end)
		}
	}

	// While stopped: the resume walk finds a record the source does not have.
	m.stop()
	produceSync(t, kgoClient(t, env.dst, kgo.DefaultProduceTopic("foreign-walk")), []*kgo.Record{{Value: []byte("foreign")}})
	m.start()
	row = waitState(t, m, "dsrc", "foreign-walk", "DIVERGED")
	if !strings.Contains(row.Reason, "beyond the source's committed data") {
		t.Fatalf("reason %q does not say what happened", row.Reason)
	}
	// Diverged in its first resume after the restart: describe shows the
	// last checkpoint's destination offset (it showed 0), and the source's
	// end and the lag as unknown (-1, never 0, which a lag alert reads as
	// caught up).
	if row.DestinationOffset != 1000 || row.Lag == 0 {
		t.Fatalf("foreign-walk DIVERGED at resume shows destination offset %d, lag %d; want the checkpoint's 1000 and an unknown lag", row.DestinationOffset, row.Lag)
	}
	if text := metricsText(t, m); strings.Contains(text, `kmirror_partition_lag_records{mirror="dsrc",partition="0",topic="foreign-walk"}`) ||
		!strings.Contains(text, `kmirror_partition_destination_offset{mirror="dsrc",partition="0",topic="foreign-walk"} 1000`) {
		t.Fatalf("/metrics for foreign-walk: want no lag series (unknown) and destination offset 1000:\n%s", text)
	}
	if !strings.Contains(metricsText(t, m), "kmirror_divergences_total 1") {
		t.Fatalf("/metrics does not count the divergence after restart:\n%s", metricsText(t, m))
	}
}
