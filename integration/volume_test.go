package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestVolume mirrors 10 topics x 8 partitions while 200k records are
// produced into them, then compares every partition record by record and
// checks describe reports lag 0 everywhere.
func TestVolume(t *testing.T) {
	m := sharedMirror(t)
	const topics, partitions, records = 10, 8, 200_000
	var names []string
	for i := 0; i < topics; i++ {
		name := fmt.Sprintf("volume-%02d", i)
		if err := env.src.CreateTopic(context.Background(), name, partitions, 1, nil); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	// Some backlog before mirroring starts, the rest while it runs.
	prod := kgoClient(t, env.src, kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	produceVolume(t, prod, names, 0, records/4)
	if _, err := m.client.AddTopics(context.Background(), api.AddTopicsRequest{Mirror: "src", Topics: names}); err != nil {
		t.Fatal(err)
	}
	produceVolume(t, prod, names, records/4, records)
	rows := waitCaughtUp(t, m, "src", names...)
	if len(rows) != topics*partitions {
		t.Fatalf("describe shows %d partitions, want %d", len(rows), topics*partitions)
	}
	for _, name := range names {
		requireSameRecords(t, readAll(t, env.src, name, partitions, true), readAll(t, env.dst, name, partitions, true))
	}
}

func produceVolume(t *testing.T, c *kgo.Client, topics []string, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	errs := make(chan error, 1)
	for i := from; i < to; i++ {
		r := &kgo.Record{
			Topic:   topics[i%len(topics)],
			Key:     []byte(fmt.Sprintf("key-%d", i%997)),
			Value:   []byte(fmt.Sprintf("value-%08d-%s", i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")),
			Headers: []kgo.RecordHeader{{Key: "n", Value: []byte(fmt.Sprint(i))}},
		}
		c.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := c.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		t.Fatalf("produce: %v", err)
	default:
	}
}
