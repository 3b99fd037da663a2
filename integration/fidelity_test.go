package integration

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// fidelityRecords are the awkward records every codec must carry intact:
// null keys, null and empty values, binary and repeated headers (one with a
// null value), old timestamps and ~1 MiB values.
func fidelityRecords(partitions int, round int) []*kgo.Record {
	old := time.Date(2001, 9, 9, 1, 46, 40, 0, time.UTC)
	big := bytes.Repeat([]byte("0123456789abcdef"), 65000) // ~1 MiB
	var out []*kgo.Record
	for i := 0; i < 60; i++ {
		r := &kgo.Record{Partition: int32(i % partitions)}
		switch i % 6 {
		case 0:
			r.Key, r.Value = nil, []byte(fmt.Sprintf("null-key-%d-%d", round, i))
		case 1:
			r.Key, r.Value = []byte(fmt.Sprintf("k%d", i)), nil
		case 2:
			r.Key, r.Value = []byte{}, []byte{}
		case 3:
			r.Key, r.Value = []byte{0, 1, 2, 0xff}, []byte(fmt.Sprintf("headers-%d", i))
			r.Headers = []kgo.RecordHeader{
				{Key: "bin", Value: []byte{0, 0xfe, 0xff}},
				{Key: "dup", Value: []byte("first")},
				{Key: "dup", Value: []byte("second")},
				{Key: "null", Value: nil},
				{Key: "", Value: []byte("empty key")},
			}
		case 4:
			r.Key, r.Value = []byte("old"), []byte(fmt.Sprintf("old-%d", i))
			r.Timestamp = old.Add(time.Duration(i) * time.Millisecond)
		case 5:
			if i%12 == 5 {
				r.Key, r.Value = []byte("big"), big
			} else {
				r.Key, r.Value = []byte("plain"), []byte(fmt.Sprintf("plain-%d-%d", round, i))
			}
		}
		if r.Timestamp.IsZero() {
			r.Timestamp = time.UnixMilli(1700000000000 + int64(round*1000+i))
		}
		out = append(out, r)
	}
	return out
}

// produceTimeout bounds a test's synchronous produce: an idempotent kgo
// producer whose batch got no answer retries it forever, whatever its
// context says, so a cluster left broken by an earlier failure would
// otherwise hang the package until go test's timeout.
const produceTimeout = 3 * time.Minute

func produceSync(t testing.TB, c *kgo.Client, recs []*kgo.Record) {
	t.Helper()
	err := within(t, produceTimeout, fmt.Sprintf("produce of %d records", len(recs)), func(ctx context.Context) error {
		return c.ProduceSync(ctx, recs...).FirstErr()
	})
	if err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// within runs f with a context that ends after d and returns its error; if
// f has not returned d+30s later, the test fails there, naming what, with
// f left running in the background.
func within(t testing.TB, d time.Duration, what string, f func(ctx context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- f(ctx) }()
	select {
	case err := <-res:
		return err
	case <-time.After(d + 30*time.Second):
		t.Fatalf("%s: not done after %v", what, d+30*time.Second)
		return nil
	}
}

// TestFidelity mirrors, for every codec, a backlog produced before the topic
// is added and records produced while it mirrors, and compares both
// clusters record by record.
func TestFidelity(t *testing.T) {
	m := sharedMirror(t)
	codecs := []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"none", kgo.NoCompression()},
		{"gzip", kgo.GzipCompression()},
		{"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"zstd", kgo.ZstdCompression()},
	}
	const partitions = 3
	for _, cc := range codecs {
		t.Run(cc.name, func(t *testing.T) {
			topic := "fidelity-" + cc.name
			// retention.ms=-1: the old timestamps must not be deleted.
			if err := env.src.CreateTopic(context.Background(), topic, partitions, 1,
				map[string]string{"max.message.bytes": "4194304", "retention.ms": "-1"}); err != nil {
				t.Fatal(err)
			}
			prod := kgoClient(t, env.src, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
				kgo.ProducerBatchCompression(cc.codec), kgo.ProducerBatchMaxBytes(4<<20),
				kgo.ProducerLinger(5*time.Millisecond))
			produceSync(t, prod, fidelityRecords(partitions, 0))
			if _, err := m.client.AddTopics(context.Background(), api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
				t.Fatal(err)
			}
			produceSync(t, prod, fidelityRecords(partitions, 1))
			waitCaughtUp(t, m, "src", topic)
			requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
		})
	}
}

// TestSmallMemoryBudget mirrors ~1 MiB records and a stream of small ones
// through a member whose memory budget (1 MiB) is smaller than one batch:
// fetch sizes shrink to what the budget allows, a batch larger than the
// budget still passes alone, and nothing stalls.
func TestSmallMemoryBudget(t *testing.T) {
	m := startMember(t, "small", memberOpts{extra: "memory_budget: 1MiB\n"})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "smallsrc", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "small-budget", 3
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, map[string]string{"max.message.bytes": "4194304", "retention.ms": "-1"}); err != nil {
		t.Fatal(err)
	}
	prod := kgoClient(t, env.src, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(4<<20))
	for round := 0; round < 3; round++ {
		produceSync(t, prod, fidelityRecords(partitions, round))
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "smallsrc", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 20_000, 50_000)()
	waitCaughtUp(t, m, "smallsrc", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
}
