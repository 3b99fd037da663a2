package integration

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestSourceTransactions has two transactional producers interleave
// committed and aborted transactions on the same partitions while the
// topic is mirrored. The destination must hold exactly the committed
// records in source order, no aborted or control record, no open
// transaction; and offset translation must be exact for every source
// offset, the aborted and marker ones included.
func TestSourceTransactions(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "transactions", 4
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, id := range []string{"A", "B"} {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			if err := runTransactions(ctx, id, topic, partitions, 60); err != nil {
				errs <- err
			}
		}(id)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitCaughtUp(t, m, "src", topic)

	src := readAll(t, env.src, topic, partitions, true)
	dst := readAll(t, env.dst, topic, partitions, true)
	requireSameRecords(t, src, dst)
	committed := 0
	for p := range dst {
		for _, r := range dst[p] {
			if strings.HasSuffix(string(r.Value), "abort") {
				t.Fatalf("destination partition %d holds aborted record %q", p, r.Value)
			}
			committed++
		}
	}
	if committed == 0 {
		t.Fatal("no committed records: the test produced nothing to compare")
	}

	// No open transaction and no transactional or control batch.
	dc := kgoClient(t, env.dst)
	lso := endOffsets(t, dc, topic, partitions, true)
	hw := endOffsets(t, dc, topic, partitions, false)
	for p := range hw {
		if lso[p] != hw[p] {
			t.Fatalf("destination partition %d: last stable offset %d != high watermark %d: a transaction is open", p, lso[p], hw[p])
		}
	}
	requirePlainBatches(t, topic, partitions)

	// Exact translation: for every source offset o, the destination offset
	// of the first mirrored record at or after o.
	srcEnd := endOffsets(t, kgoClient(t, env.src), topic, partitions, true)
	aborted := 0
	for p := 0; p < partitions; p++ {
		s, d := src[p], dst[p]
		j := 0
		for o := int64(0); o <= srcEnd[p]; o++ {
			for j < len(s) && s[j].Offset < o {
				j++
			}
			want := hw[p]
			if j < len(s) {
				want = d[j].Offset
				if s[j].Offset != o {
					aborted++
				}
			}
			got, err := m.client.Translate(ctx, "src", topic, int32(p), o)
			if err != nil {
				t.Fatalf("translate %d/%d: %v", p, o, err)
			}
			if got.DestinationOffset != want {
				t.Fatalf("translate partition %d source offset %d = %d, want %d", p, o, got.DestinationOffset, want)
			}
		}
	}
	t.Logf("translation exact for every source offset (%d of them aborted records or markers)", aborted)
	if aborted == 0 {
		t.Fatal("no aborted record or marker: the test did not exercise gaps")
	}
}

// runTransactions runs n transactions of a transactional producer, each
// writing to every partition; a random half abort.
func runTransactions(ctx context.Context, id, topic string, partitions, n int) error {
	// Flush and EndTransaction give up at this bound rather than hang the
	// package on a source that stopped answering.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(env.src.Bootstrap(), ",")...),
		kgo.TransactionalID("kmirror-it-"+id), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	for i := 0; i < n; i++ {
		if err := c.BeginTransaction(); err != nil {
			return fmt.Errorf("%s begin: %w", id, err)
		}
		commit := rng.Intn(2) == 0
		outcome := "abort"
		if commit {
			outcome = "commit"
		}
		for j := 0; j < 5*partitions; j++ {
			r := &kgo.Record{Partition: int32(j % partitions), Key: []byte(id),
				Value: []byte(fmt.Sprintf("%s-txn%03d-rec%02d-%s", id, i, j, outcome))}
			c.Produce(ctx, r, nil)
		}
		if err := c.Flush(ctx); err != nil {
			return fmt.Errorf("%s flush: %w", id, err)
		}
		if err := c.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			return fmt.Errorf("%s end: %w", id, err)
		}
	}
	return nil
}

// requirePlainBatches reads the destination's raw batches and fails on any
// control or transactional batch.
func requirePlainBatches(t *testing.T, topic string, partitions int) {
	t.Helper()
	ctx := context.Background()
	conn, err := kwire.Dial(ctx, env.dst.BrokerAddrs()[0], "kmirror-it", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for p := 0; p < partitions; p++ {
		var off int64
		for {
			res, err := conn.Fetch(ctx, &kwire.FetchRequest{MaxBytes: 16 << 20, Partitions: []kwire.FetchPartition{
				{Topic: topic, Partition: int32(p), Offset: off, LeaderEpoch: -1, MaxBytes: 16 << 20}}})
			if err != nil || len(res) != 1 || res[0].Err != 0 {
				t.Fatalf("raw fetch of destination %s/%d: %v %+v", topic, p, err, res)
			}
			batches, _, err := kwire.SplitBatches(res[0].Records)
			if err != nil {
				t.Fatal(err)
			}
			if len(batches) == 0 {
				break
			}
			for _, b := range batches {
				if b.IsControl() || b.IsTransactional() {
					t.Fatalf("destination %s/%d holds %v: control or transactional batches must never reach the destination", topic, p, b)
				}
				off = b.LastOffset() + 1
			}
		}
	}
}
