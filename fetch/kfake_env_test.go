package fetch

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// The engine tests' fixtures: a control plane that records what the engine
// tells it, and a source and a destination in franz-go's kfake.

// fakeControl is the control plane for engine tests: it grants a lease
// that never ends and records what the engine reports.
type fakeControl struct {
	mu       sync.Mutex
	states   map[Key][]State
	gens     map[Key][]uint64 // the generation of each report in states
	reasons  map[Key]string
	renewals []Key
	saved    map[Key]kafka.ProducerID
	deadline time.Time // zero: a lease that never ends
	// checkSlack > 0 caps every write deadline at that long from now, as
	// the owner caps it at its lease loop's last check plus 500 ms.
	checkSlack time.Duration
	losses     uint64 // LeaseLosses
	// onDeadline, when set, runs (under mu) in each WriteDeadline call
	// until it reports true: a lease event between a caller's reads.
	onDeadline func(*fakeControl) bool
	gaps       [][2]int64
}

func newFakeControl() *fakeControl {
	return &fakeControl{states: map[Key][]State{}, gens: map[Key][]uint64{}, reasons: map[Key]string{}, saved: map[Key]kafka.ProducerID{}}
}

func (c *fakeControl) SaveProducer(_ context.Context, k Key, _ uint64, id kafka.ProducerID) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.saved[k] = id
	return nil
}

func (c *fakeControl) Report(k Key, gen uint64, s State, reason string, _ int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states[k] = append(c.states[k], s)
	c.gens[k] = append(c.gens[k], gen)
	c.reasons[k] = reason
}

func (c *fakeControl) RenewProducer(k Key, _ uint64, _ string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewals = append(c.renewals, k)
}

func (c *fakeControl) RecordGap(_ context.Context, k Key, _ uint64, from, to int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gaps = append(c.gaps, [2]int64{from, to})
	return nil
}

func (c *fakeControl) LeaseLosses() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.losses
}

func (c *fakeControl) WriteDeadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.onDeadline; f != nil && f(c) {
		c.onDeadline = nil
	}
	return c.deadlineAheadLocked(0)
}

func (c *fakeControl) WriteDeadlineAhead(ahead time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadlineAheadLocked(ahead)
}

// deadlineAheadLocked is the lease's end less ahead, capped at checkSlack
// from now as the owner caps it at its lease loop's last check.
func (c *fakeControl) deadlineAheadLocked(ahead time.Duration) time.Time {
	dl := c.deadline
	if dl.IsZero() {
		dl = time.Now().Add(time.Hour)
	}
	dl = dl.Add(-ahead)
	if c.checkSlack > 0 {
		if bound := time.Now().Add(c.checkSlack); bound.Before(dl) {
			dl = bound
		}
	}
	return dl
}

// kfakePair is a source and a destination kfake cluster and an engine
// mirroring from one into the other.
type kfakePair struct {
	t        testing.TB
	src, dst *kfake.Cluster
	ctl      *fakeControl
	e        *Engine
}

// newKfakePair starts both clusters and the engine; with sets the engine's
// Config beyond the fixture's.
func newKfakePair(t testing.TB, with ...func(*Config)) *kfakePair {
	t.Helper()
	return newKfakePairDst(t, nil, with...)
}

// newKfakePairDst is newKfakePair with more options for the destination
// cluster.
func newKfakePairDst(t testing.TB, dstOpts []kfake.Opt, with ...func(*Config)) *kfakePair {
	t.Helper()
	src, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	dst, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, dstOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	x := &kfakePair{t: t, src: src, dst: dst, ctl: newFakeControl()}
	cfg := Config{Destination: dst.ListenAddrs(), Checkpoint: 100 * time.Millisecond, RetryBackoff: 20 * time.Millisecond}
	for _, f := range with {
		f(&cfg)
	}
	x.e = New(cfg, x.ctl, zaptest.NewLogger(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := x.e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = x.e.Close(cctx)
	})
	x.e.SetSource("m", Source{Bootstrap: src.ListenAddrs()})
	return x
}

// mirroredAt creates a one-partition topic with n records, assigns it
// under generation gen and waits until it is mirrored; it returns the
// specs assigned.
func (x *kfakePair) mirroredAt(topic string, gen uint64, n int) []Spec {
	x.t.Helper()
	x.createTopic(topic, 1)
	x.produce(x.src, topic, 0, n)
	sp := specs(topic, 1)
	sp[0].Generation = gen
	x.e.Assign(sp)
	x.waitCaughtUp(topic, 1)
	return sp
}

func (x *kfakePair) client(cl *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	x.t.Helper()
	c, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(cl.ListenAddrs()...)}, opts...)...)
	if err != nil {
		x.t.Fatal(err)
	}
	x.t.Cleanup(c.Close)
	return c
}

// mirrorCaughtUp creates topic with n partitions on both clusters, writes
// records into the source, assigns every partition to the engine and
// waits until it has mirrored them.
func (x *kfakePair) mirrorCaughtUp(topic string, n int32, records int) {
	x.t.Helper()
	x.createTopic(topic, n)
	x.produce(x.src, topic, 0, records)
	x.e.Assign(specs(topic, n))
	x.waitCaughtUp(topic, n)
}

// createTopic creates topic with n partitions on both clusters.
func (x *kfakePair) createTopic(topic string, n int32) {
	x.t.Helper()
	for _, cl := range []*kfake.Cluster{x.src, x.dst} {
		if err := cl.CreateTopic(topic, n, nil); err != nil {
			x.t.Fatal(err)
		}
	}
}

// produce writes n keyed records with a header into topic on cl.
func (x *kfakePair) produce(cl *kfake.Cluster, topic string, from, n int) {
	x.t.Helper()
	prod := x.client(cl, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond))
	for i := from; i < from+n; i++ {
		prod.Produce(context.Background(), &kgo.Record{
			Key: []byte(fmt.Sprintf("k%d", i%7)), Value: []byte(fmt.Sprintf("v%d", i)),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte{byte(i)}}},
		}, nil)
	}
	if err := prod.Flush(context.Background()); err != nil {
		x.t.Fatal(err)
	}
}

// records reads every record of topic on cl, by partition.
func (x *kfakePair) records(cl *kfake.Cluster, topic string, partitions int32) [][]*kgo.Record {
	x.t.Helper()
	out := make([][]*kgo.Record, partitions)
	for p := range partitions {
		info := cl.PartitionInfo(topic, p)
		if info == nil || info.HighWatermark == 0 {
			continue
		}
		c := x.client(cl, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {p: kgo.NewOffset().AtStart()}}))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for int64(len(out[p])) < info.HighWatermark {
			fs := c.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				cancel()
				x.t.Fatalf("reading %s/%d: %d of %d records", topic, p, len(out[p]), info.HighWatermark)
			}
			fs.EachRecord(func(r *kgo.Record) { out[p] = append(out[p], r) })
		}
		cancel()
	}
	return out
}

// requireMirrored compares source and destination record by record:
// offset, key, value, headers, timestamp.
func (x *kfakePair) requireMirrored(topic string, partitions int32) {
	x.t.Helper()
	src, dst := x.records(x.src, topic, partitions), x.records(x.dst, topic, partitions)
	for p := range src {
		if len(src[p]) != len(dst[p]) {
			x.t.Fatalf("%s/%d: source %d records, destination %d", topic, p, len(src[p]), len(dst[p]))
		}
		for i, a := range src[p] {
			b := dst[p][i]
			if a.Offset != b.Offset || string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) ||
				!a.Timestamp.Equal(b.Timestamp) || fmt.Sprint(a.Headers) != fmt.Sprint(b.Headers) {
				x.t.Fatalf("%s/%d offset %d: source %+v, destination %+v", topic, p, a.Offset, a, b)
			}
		}
	}
}

// waitCaughtUp waits until every held partition mirrors with lag 0 and the
// destination holds what the source does.
func (x *kfakePair) waitCaughtUp(topic string, partitions int32) {
	x.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		done := x.caughtUp(topic, partitions)
		for _, st := range x.e.Statuses() {
			if st.State != Mirroring || st.Lag != 0 {
				done = false
			}
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("not caught up within 20s: %+v", x.e.Statuses())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// caughtUp says whether every partition of topic has the same high
// watermark on both clusters.
func (x *kfakePair) caughtUp(topic string, partitions int32) bool {
	for p := range partitions {
		s, d := x.src.PartitionInfo(topic, p), x.dst.PartitionInfo(topic, p)
		if s == nil || d == nil || s.HighWatermark != d.HighWatermark {
			return false
		}
	}
	return true
}

// leased gives each spec the producer identity its partition saved
// (SaveProducer), as the raft state carries it to the next lease.
func (x *kfakePair) leased(in []Spec) []Spec {
	x.ctl.mu.Lock()
	defer x.ctl.mu.Unlock()
	out := slices.Clone(in)
	for i := range out {
		if id, ok := x.ctl.saved[out[i].Key]; ok {
			out[i].Producer = &id
		}
	}
	return out
}

func specs(topic string, partitions int32) []Spec {
	var out []Spec
	for p := range partitions {
		out = append(out, Spec{Key: Key{Mirror: "m", Topic: topic, Partition: p}})
	}
	return out
}

// waitUntil polls cond every 10 ms until it holds, or fails the test after d.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
