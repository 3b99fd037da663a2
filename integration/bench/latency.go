package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

const (
	// drainTimeout is how long the consumer may go without a new record
	// once producing has ended before the missing records count as lost.
	drainTimeout = 30 * time.Second
	warmupKey    = "warmup"
)

// latencyResult is the steady-rate run through kmirror. A latency is a
// consumer's receive time minus the record's timestamp, which the producer
// set to its send time.
type latencyResult struct {
	Sent      int
	Producing time.Duration // from the first send to the last
	// Mirrored is measured on the destination: producer send → destination
	// consumer receive. Source is the same records read from the source
	// topic, the share of the latency that is not kmirror's. Direct
	// (Config.LatencyDirect, else zero) is the same records produced
	// straight into a fresh destination topic and read there.
	Mirrored, Source, Direct latencyStats
	// DaemonCPU is kmirror's user+system time over DaemonWall, from the
	// first send until the last record arrived.
	DaemonCPU  time.Duration
	DaemonWall time.Duration
	// SourceBatches holds SourceBatchRecords records; the destination
	// consumer read DestinationBatches.
	SourceBatches, SourceBatchRecords, DestinationBatches int64
}

type latencyStats struct {
	Records       int
	P50, P99, Max time.Duration
	// P50BySecond is the median of the records sent in each second of the
	// run: it shows whether the latency is steady or grows with a queue.
	P50BySecond []time.Duration
}

// latencyPath is what carries the latency run's records from the source
// to the destination: kmirror, or MirrorMaker 2 for comparison.
type latencyPath struct {
	name  string // "kmirror", "MirrorMaker 2"
	topic string // a fresh source topic for this path alone
	// start makes the path carry topic (created in the source already);
	// stop, if set, ends what start began.
	start func(ctx context.Context) error
	stop  func()
	// sample reads the path's CPU time (all its processes).
	sample func() (procSample, error)
}

// kmirrorLatencyPath adds the latency topic to the bench mirror from the
// latest offset and waits until every partition is MIRRORING.
func (b *bench) kmirrorLatencyPath() latencyPath {
	return latencyPath{
		name: "kmirror", topic: latencyTopic,
		start: func(ctx context.Context) error {
			_, err := b.group.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirrorName, Topics: []string{latencyTopic}, StartFrom: "latest"})
			if err != nil {
				return fmt.Errorf("add topic %s: %w", latencyTopic, err)
			}
			if err := b.waitMirroring(ctx, latencyTopic); err != nil {
				return err
			}
			b.printf("topic %s added (start from latest) and MIRRORING on all %d partitions", latencyTopic, b.cfg.Partitions)
			return nil
		},
		sample: func() (procSample, error) { return b.group.sample(b.ticks) },
	}
}

// measureLatency creates the path's fresh topic, starts the path on it,
// produces into it at the configured rate with records stamped with their
// send time, and reads them on the destination and, for reference, on the
// source.
func (b *bench) measureLatency(ctx context.Context, path latencyPath) (latencyResult, error) {
	latencyTopic := path.topic
	if err := b.src.CreateTopic(ctx, latencyTopic, b.cfg.Partitions, 1, nil); err != nil {
		return latencyResult{}, err
	}
	if err := path.start(ctx); err != nil {
		return latencyResult{}, err
	}
	if path.stop != nil {
		defer path.stop()
	}

	var produced, read batchCounter
	// With --rtt the producer and the source's own consumer sit in the
	// source's region (they dial from inside the delay line's namespace):
	// only kmirror's fetches cross the line, as across real regions.
	// Outside, the producer's acks cross it too, and at 5 MiB/s it falls
	// seconds behind (p50 1.5 s on both paths).
	var sourceSide []kgo.Opt
	if b.line != nil {
		sourceSide = append(sourceSide, kgo.Dialer(b.line.DialContext))
	}
	producer, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(strings.Split(b.src.Bootstrap(), ",")...),
		kgo.WithHooks(&produced),
		kgo.DefaultProduceTopic(latencyTopic),
		kgo.ProducerBatchCompression(codec(b.cfg.Compression)),
		kgo.ProducerLinger(b.cfg.LatencyLinger),
	}, sourceSide...)...)
	if err != nil {
		return latencyResult{}, err
	}
	defer producer.Close()
	var direct *directPath
	if b.cfg.LatencyDirect {
		if direct, err = b.newDirectPath(ctx, latencyTopic+"-direct"); err != nil {
			return latencyResult{}, err
		}
		defer direct.producer.Close()
	}
	dst, src := newReceiver(b, "destination"), newReceiver(b, "source")
	receivers := []*receiver{dst, src}
	type consumer struct {
		rcv     *receiver
		servers string
		hooks   []kgo.Hook
		topic   string
		opts    []kgo.Opt
	}
	consumed := []consumer{{dst, b.dst.Bootstrap(), []kgo.Hook{&read}, latencyTopic, nil}, {src, b.src.Bootstrap(), nil, latencyTopic, sourceSide}}
	if direct != nil {
		receivers = append(receivers, direct.rcv)
		consumed = append(consumed, consumer{direct.rcv, b.dst.Bootstrap(), nil, direct.topic, nil})
	}
	rctx, stopReceiving := context.WithCancel(ctx)
	var (
		wg        sync.WaitGroup
		consumers []*kgo.Client
	)
	defer func() {
		stopReceiving()
		wg.Wait()
		for _, c := range consumers {
			c.Close()
		}
	}()
	for _, r := range consumed {
		consumer, err := kgo.NewClient(append([]kgo.Opt{
			kgo.SeedBrokers(strings.Split(r.servers, ",")...),
			kgo.WithHooks(r.hooks...),
			kgo.ConsumeTopics(r.topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchMaxWait(10 * time.Millisecond),
		}, r.opts...)...)
		if err != nil {
			return latencyResult{}, err
		}
		consumers = append(consumers, consumer)
		wg.Go(func() { r.rcv.run(rctx, consumer) })
	}

	// One record through the whole path first, so that connections and
	// metadata are in place before the measured records.
	payloads := newPayloads(b.cfg.RecordSize)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute) // franz-go retries for ever
	defer wcancel()
	if err := producer.ProduceSync(wctx, &kgo.Record{Key: []byte(warmupKey), Value: payloads.next()}).FirstErr(); err != nil {
		return latencyResult{}, fmt.Errorf("produce the warm-up record to the source: %w", err)
	}
	if direct != nil {
		if err := direct.producer.ProduceSync(wctx, &kgo.Record{Key: []byte(warmupKey), Value: payloads.next()}).FirstErr(); err != nil {
			return latencyResult{}, fmt.Errorf("produce the warm-up record to the destination: %w", err)
		}
	}
	for _, r := range receivers {
		if err := waitFor(ctx, time.Minute, r.warm.Load); err != nil {
			return latencyResult{}, fmt.Errorf("the warm-up record did not reach the %s consumer within a minute: %w", r.name, err)
		}
	}
	b.printf("warm-up record arrived at the destination; producing %.0f records/s for %ds",
		b.cfg.LatencyRecordsPerSecond(), b.cfg.LatencySeconds)

	produced.reset()
	read.reset()
	before, err := path.sample()
	if err != nil {
		return latencyResult{}, err
	}
	sampled := time.Now()
	var also *kgo.Client
	if direct != nil {
		also = direct.producer
	}
	res, acked, err := b.produceSteadily(ctx, producer, also, payloads)
	if err != nil {
		return latencyResult{}, err
	}
	for _, r := range receivers {
		if err := r.drain(ctx, acked); err != nil {
			return latencyResult{}, err
		}
	}
	after, err := path.sample()
	if err != nil {
		return latencyResult{}, err
	}
	res.DaemonCPU, res.DaemonWall = after.CPU-before.CPU, time.Since(sampled)
	stopReceiving()
	wg.Wait()

	perSecond := int(math.Ceil(b.cfg.LatencyRecordsPerSecond()))
	for _, r := range receivers {
		if r.duplicates > 0 {
			b.printf("  NOTE: the %s consumer saw %d records twice", r.name, r.duplicates)
		}
		if n := r.received.Load(); n < int64(acked) {
			return latencyResult{}, fmt.Errorf("%d of %d records acknowledged by the source never reached the %s consumer (none arrived for %s)",
				int64(acked)-n, acked, r.name, drainTimeout)
		}
	}
	if res.Mirrored, err = dst.stats(perSecond); err != nil {
		return latencyResult{}, err
	}
	if res.Source, err = src.stats(perSecond); err != nil {
		return latencyResult{}, err
	}
	if direct != nil {
		if res.Direct, err = direct.rcv.stats(perSecond); err != nil {
			return latencyResult{}, err
		}
	}
	res.SourceBatches, res.SourceBatchRecords, res.DestinationBatches = produced.batches.Load(), produced.records.Load(), read.batches.Load()
	b.printLatency(path.name, res)
	return res, nil
}

func (b *bench) printLatency(name string, res latencyResult) {
	b.printf("produced %d records in %.1fs: %.2f MB/s payload (asked for %s/s); %s used %.0f%% of a core meanwhile",
		res.Sent, res.Producing.Seconds(), float64(res.Sent*b.cfg.RecordSize)/mib/res.Producing.Seconds(),
		formatSize(b.cfg.LatencyRate), name, 100*res.DaemonCPU.Seconds()/res.DaemonWall.Seconds())
	b.printf("record batches: the producer wrote %d to the source (%.1f records each, %.0f/s); the destination consumer read %d (kmirror sends each source batch as one destination batch; MirrorMaker 2 re-batches)",
		res.SourceBatches, float64(res.SourceBatchRecords)/float64(max(1, res.SourceBatches)),
		float64(res.SourceBatches)/res.Producing.Seconds(), res.DestinationBatches)
	b.printf("latency = consumer receive time − record timestamp (the producer's send time, 1 ms resolution); " +
		"through kmirror it is an upper bound on source append → destination append, as it also holds the producer's " +
		"batching and the consumer's fetch (FetchMaxWait 10ms)")
	b.printf("through %s (producer send → destination consumer receive), %d records: p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		name, res.Mirrored.Records, ms(res.Mirrored.P50), ms(res.Mirrored.P99), ms(res.Mirrored.Max))
	b.printf("  p50 by second of sending: %s", formatDurations(res.Mirrored.P50BySecond))
	b.printf("reference without a mirror (producer send → source consumer receive): p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		ms(res.Source.P50), ms(res.Source.P99), ms(res.Source.Max))
	b.printf("  p50 by second of sending: %s", formatDurations(res.Source.P50BySecond))
	if res.Direct.Records > 0 {
		b.printf("the same records produced straight into a fresh destination topic (producer send → destination consumer receive): p50 %.1f ms, p99 %.1f ms, max %.1f ms",
			ms(res.Direct.P50), ms(res.Direct.P99), ms(res.Direct.Max))
		b.printf("  p50 by second of sending: %s", formatDurations(res.Direct.P50BySecond))
	}
}

// directPath is the latency run's second reference (Config.LatencyDirect):
// a producer writing each record also into a fresh destination topic, and
// its receiver there.
type directPath struct {
	topic    string
	producer *kgo.Client
	rcv      *receiver
}

func (b *bench) newDirectPath(ctx context.Context, topic string) (*directPath, error) {
	if err := b.dst.CreateTopic(ctx, topic, b.cfg.Partitions, 1, nil); err != nil {
		return nil, err
	}
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(b.dst.Bootstrap(), ",")...),
		kgo.DefaultProduceTopic(topic),
		kgo.ProducerBatchCompression(codec(b.cfg.Compression)),
		kgo.ProducerLinger(b.cfg.LatencyLinger),
	)
	if err != nil {
		return nil, err
	}
	return &directPath{topic: topic, producer: producer, rcv: newReceiver(b, "direct destination")}, nil
}

// produceSteadily sends records at the configured rate for the configured
// time, each stamped with its send time and keyed with its sequence number,
// also through also (nil: none), and waits for their acknowledgements. It
// returns how many were acknowledged.
func (b *bench) produceSteadily(ctx context.Context, producer, also *kgo.Client, payloads *payloads) (latencyResult, int, error) {
	var (
		failed   atomic.Int64
		firstErr atomic.Pointer[error]
	)
	promise := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, &err)
		}
	}
	rate := b.cfg.LatencyRecordsPerSecond()
	length := time.Duration(b.cfg.LatencySeconds) * time.Second
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	sent := 0
	for {
		elapsed := time.Since(start)
		if elapsed >= length {
			break
		}
		for due := int(elapsed.Seconds() * rate); sent < due; sent++ {
			key := make([]byte, 8)
			binary.BigEndian.PutUint64(key, uint64(sent))
			rec := &kgo.Record{Key: key, Value: payloads.next(), Timestamp: time.Now()}
			if also != nil {
				// The same record, sent at the same time, straight to the
				// destination.
				also.Produce(ctx, &kgo.Record{Key: key, Value: rec.Value, Timestamp: rec.Timestamp}, promise)
			}
			producer.Produce(ctx, rec, promise)
		}
		select {
		case <-ctx.Done():
			return latencyResult{}, 0, ctx.Err()
		case <-tick.C:
		}
	}
	producing := time.Since(start)
	if err := producer.Flush(ctx); err != nil {
		return latencyResult{}, 0, err
	}
	if also != nil {
		if err := also.Flush(ctx); err != nil {
			return latencyResult{}, 0, err
		}
	}
	if n := failed.Load(); n > 0 {
		b.printf("  NOTE: %d of %d sends to the source failed; first: %v", n, sent, *firstErr.Load())
	}
	return latencyResult{Sent: sent, Producing: producing}, sent - int(failed.Load()), nil
}

// batchCounter is a kgo hook counting the record batches a client wrote
// or read.
type batchCounter struct{ batches, records atomic.Int64 }

func (c *batchCounter) OnProduceBatchWritten(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.ProduceBatchMetrics) {
	c.batches.Add(1)
	c.records.Add(int64(m.NumRecords))
}

func (c *batchCounter) OnFetchBatchRead(_ kgo.BrokerMetadata, _ string, _ int32, m kgo.FetchBatchMetrics) {
	c.batches.Add(1)
	c.records.Add(int64(m.NumRecords))
}

func (c *batchCounter) reset() {
	c.batches.Store(0)
	c.records.Store(0)
}

// receiver consumes the latency topic of one cluster and records each
// measured record's latency by sequence number; latencies and duplicates
// are read only after run returns.
type receiver struct {
	b          *bench
	name       string // cluster
	warm       atomic.Bool
	received   atomic.Int64
	latencies  []time.Duration // by sequence number; -1 until received
	duplicates int
}

func newReceiver(b *bench, name string) *receiver { return &receiver{b: b, name: name} }

func (r *receiver) run(ctx context.Context, consumer *kgo.Client) {
	notes := 0
	for {
		fs := consumer.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		now := time.Now()
		fs.EachError(func(topic string, p int32, err error) {
			if notes < 5 && !errors.Is(err, context.Canceled) {
				notes++
				r.b.printf("  NOTE: %s consumer error on %s/%d: %v", r.name, topic, p, err)
			}
		})
		fs.EachRecord(func(rec *kgo.Record) {
			if string(rec.Key) == warmupKey {
				r.warm.Store(true)
				return
			}
			if len(rec.Key) != 8 {
				return
			}
			seq := int(binary.BigEndian.Uint64(rec.Key))
			for len(r.latencies) <= seq {
				r.latencies = append(r.latencies, -1)
			}
			if r.latencies[seq] >= 0 {
				r.duplicates++
				return
			}
			r.latencies[seq] = now.Sub(rec.Timestamp)
			r.received.Add(1)
		})
	}
}

// drain waits until want records arrived, or none for drainTimeout.
func (r *receiver) drain(ctx context.Context, want int) error {
	last, lastChange := r.received.Load(), time.Now()
	for r.received.Load() < int64(want) {
		if n := r.received.Load(); n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) > drainTimeout {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// stats summarises the latencies; perSecond is the number of records sent
// per second.
func (r *receiver) stats(perSecond int) (latencyStats, error) {
	var all []time.Duration
	var bySecond []time.Duration
	var second []time.Duration
	for seq, l := range r.latencies {
		if l >= 0 {
			all = append(all, l)
			second = append(second, l)
		}
		if (seq+1)%perSecond == 0 || seq == len(r.latencies)-1 {
			if len(second) > 0 {
				slices.Sort(second)
				bySecond = append(bySecond, percentile(second, 0.5))
			}
			second = second[:0]
		}
	}
	if len(all) == 0 {
		return latencyStats{}, errors.New("no records were measured: raise --latency-rate or --latency-seconds")
	}
	slices.Sort(all)
	return latencyStats{Records: len(all), P50: percentile(all, 0.5), P99: percentile(all, 0.99),
		Max: all[len(all)-1], P50BySecond: bySecond}, nil
}

func formatDurations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%.0f", ms(d))
	}
	return strings.Join(parts, " ") + " ms"
}

// waitMirroring polls describe until every partition of topic is
// MIRRORING with a live source offset.
func (b *bench) waitMirroring(ctx context.Context, topic string) error {
	w := newWatcher(b, topic)
	for {
		rows, err := w.poll(ctx)
		if err != nil {
			return err
		}
		if _, ok := progress(rows, b.cfg.Partitions); ok {
			return nil
		}
		if err := w.sleep(ctx); err != nil {
			return err
		}
	}
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// percentile returns the nearest-rank q-quantile of sorted values.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func codec(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// payloads hands out record values of random capital letters, as
// ProducerPerformance sends, from a pool generated once.
type payloads struct {
	pool [][]byte
	i    int
}

func newPayloads(size int) *payloads {
	p := &payloads{pool: make([][]byte, 64)}
	for i := range p.pool {
		v := make([]byte, size)
		for j := range v {
			v[j] = byte('A' + rand.IntN(26))
		}
		p.pool[i] = v
	}
	return p
}

func (p *payloads) next() []byte {
	p.i = (p.i + 1) % len(p.pool)
	return p.pool[p.i]
}
