package integration

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// streamRecords produces n records into topic at roughly rate records/s
// from a goroutine; wait returns when all are acknowledged.
func streamRecords(t *testing.T, topic string, n, rate int) (wait func()) {
	t.Helper()
	return streamRecordsTo(t, env.src, topic, n, rate)
}

// streamRecordsTo is streamRecords into any cluster.
func streamRecordsTo(t *testing.T, cl *harness.Cluster, topic string, n, rate int) (wait func()) {
	t.Helper()
	return streamAged(t, cl, topic, n, rate, 0)
}

// streamAged is streamRecordsTo with record timestamps age in the past
// (0: the producer's clock).
func streamAged(t *testing.T, cl *harness.Cluster, topic string, n, rate int, age time.Duration) (wait func()) {
	t.Helper()
	return streamAgedUntil(t, cl, topic, n, rate, age, nil)
}

// streamAgedUntil is streamAged that also ends, after fewer than n records,
// once stop is closed (nil: never); wait then returns when every record
// produced is acknowledged.
func streamAgedUntil(t *testing.T, cl *harness.Cluster, topic string, n, rate int, age time.Duration, stop <-chan struct{}) (wait func()) {
	t.Helper()
	prod := kgoClient(t, cl, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(2*time.Millisecond),
		kgo.ProducerBatchCompression(kgo.Lz4Compression()))
	var mu sync.Mutex
	var firstErr error
	done := make(chan struct{})
	// The stream's own duration plus room for outages; then Flush gives up.
	limit := time.Duration(n/rate)*time.Second + 5*time.Minute
	deadline := time.Now().Add(limit + 30*time.Second)
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		defer cancel()
		start := time.Now()
		for i := 0; i < n; i++ {
			if stopped(stop) {
				break
			}
			if i%1000 == 0 {
				// Pace the stream so it spans the whole test.
				if ahead := time.Duration(i)*time.Second/time.Duration(rate) - time.Since(start); ahead > 0 {
					time.Sleep(ahead)
				}
			}
			r := &kgo.Record{
				Key:   []byte(fmt.Sprintf("k%d", i%5000)),
				Value: []byte(fmt.Sprintf("record-%09d", i)),
			}
			if age > 0 {
				r.Timestamp = time.Now().Add(-age)
			}
			prod.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			})
		}
		if err := prod.Flush(ctx); err != nil {
			mu.Lock()
			firstErr = err
			mu.Unlock()
		}
	}()
	return func() {
		t.Helper()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("producing into %s: %d records not all acknowledged within %v", topic, n, limit)
		}
		mu.Lock()
		defer mu.Unlock()
		if firstErr != nil {
			t.Fatalf("producing into %s: %v", topic, firstErr)
		}
	}
}

// stopped reports whether stop is closed; a nil stop never is.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// TestCrashResume kills the daemon with SIGKILL at random moments while a
// 300k-record stream is mirrored, restarting it each time (and once stops
// it with SIGTERM), then requires the destination to equal the source
// record by record: no loss, no duplicate.
func TestCrashResume(t *testing.T) {
	m := startMember(t, "crash", memberOpts{})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "crashsrc", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "crash", 8
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	wait := streamRecords(t, topic, 300_000, 12_000)
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "crashsrc", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("kill schedule seed %d", seed)
	for i := 0; i < 6; i++ {
		<-time.After(time.Duration(1000+rng.Intn(3000)) * time.Millisecond)
		if i == 3 {
			m.stop() // a clean SIGTERM shutdown in the middle: exit status 0
			t.Logf("stopped the daemon with SIGTERM")
		} else {
			m.kill9()
			t.Logf("killed the daemon with SIGKILL (%d)", i+1)
		}
		<-time.After(time.Duration(rng.Intn(500)) * time.Millisecond)
		m.start()
	}
	wait()
	waitCaughtUp(t, m, "crashsrc", topic)
	src := readAll(t, env.src, topic, partitions, true)
	n := 0
	for _, p := range src {
		n += len(p)
	}
	if n != 300_000 {
		t.Fatalf("source holds %d records, want 300000", n)
	}
	requireSameRecords(t, src, readAll(t, env.dst, topic, partitions, true))
	// The kills must have hit the verified-walk path, or this test proved
	// nothing about resuming past the last checkpoint.
	walks := resumeWalks(t, m)
	t.Logf("resumes that verified records past a checkpoint: %d", walks)
	if walks == 0 {
		t.Fatalf("no resume walked past a checkpoint: the kills did not exercise exact resume")
	}
}

// resumeWalks counts "partition resumed" log lines of the member whose walk
// verified at least one record.
func resumeWalks(t *testing.T, m *member) int {
	t.Helper()
	n := 0
	for _, l := range logLines(t, m, "partition resumed") {
		if l.Walked > 0 {
			n++
		}
	}
	return n
}
