package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// TestRemoveRecordsLastMirroredPosition stops mirroring a topic (failover):
// the topic goes STOPPED, its last mirrored position per partition is
// recorded in describe and in the __kmirror_state topic (readable with plain
// Kafka), and later source records are no longer copied.
func TestRemoveRecordsLastMirroredPosition(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "failover", 3
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 3000, 100_000)()
	waitCaughtUp(t, m, "src", topic)
	if err := m.client.RemoveTopic(ctx, "src", topic); err != nil {
		t.Fatal(err)
	}
	rows, err := m.client.Describe(ctx, "src", topic)
	if err != nil {
		t.Fatal(err)
	}
	dc := kgoClient(t, env.dst)
	dstEnd := endOffsets(t, dc, topic, partitions, false)
	srcEnd := endOffsets(t, kgoClient(t, env.src), topic, partitions, true)
	for _, r := range rows {
		if r.State != "STOPPED" || r.DestinationOffset != dstEnd[r.Partition] || r.SourceOffset != srcEnd[r.Partition] {
			t.Fatalf("after remove: %+v, want STOPPED at source %d destination %d", r, srcEnd[r.Partition], dstEnd[r.Partition])
		}
	}

	// The state topic holds the same positions, keyed per partition.
	got := readAll(t, env.dst, "__kmirror_state", 1, false)[0]
	found := 0
	for _, rec := range got {
		parts := strings.Split(string(rec.Key), "\x00")
		if len(parts) != 4 || parts[0] != "stopped" || parts[1] != "src" || parts[2] != topic {
			continue
		}
		var pos raftstore.Position
		if err := json.Unmarshal(rec.Value, &pos); err != nil {
			t.Fatal(err)
		}
		p := rows[0].Partition
		for _, r := range rows {
			if r.Partition == int32(atoi(t, parts[3])) {
				p = r.Partition
			}
		}
		if pos.DestinationOffset != dstEnd[p] || pos.SourceOffset != srcEnd[p] || pos.SourceClusterID == "" {
			t.Fatalf("state record for partition %d = %+v, want source %d destination %d", p, pos, srcEnd[p], dstEnd[p])
		}
		found++
	}
	if found != partitions {
		t.Fatalf("__kmirror_state has %d records for %s, want %d", found, topic, partitions)
	}

	// Records produced after the stop stay on the source only.
	streamRecords(t, topic, 500, 100_000)()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		now := endOffsets(t, dc, topic, partitions, false)
		for p := range now {
			if now[p] != dstEnd[p] {
				t.Fatalf("destination partition %d moved from %d to %d after the topic was stopped", p, dstEnd[p], now[p])
			}
		}
		<-time.After(200 * time.Millisecond)
	}
	// And the destination topic is writable by applications now.
	prod := kgoClient(t, env.dst, kgo.DefaultProduceTopic(topic))
	produceSync(t, prod, []*kgo.Record{{Value: []byte("written after failover")}})
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}
