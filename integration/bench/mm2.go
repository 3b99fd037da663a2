package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// mirrorMaker2Main is MirrorMaker 2's dedicated-mode entry point (what
// connect-mirror-maker.sh runs).
const mirrorMaker2Main = "org.apache.kafka.connect.mirror.MirrorMaker"

// mm2Result is one MirrorMaker 2 run over a backlog topic.
type mm2Result struct {
	Records int64
	// Startup is from the JVM's launch until the first record is at the
	// destination (worker start, topic discovery, task start).
	Startup time.Duration
	// Elapsed is from the first record at the destination until the last:
	// the copy rate alone, which flatters MirrorMaker 2 (kmirror's
	// Elapsed counts from the add topic command).
	Elapsed time.Duration
	CPU     time.Duration // the JVM's user+system time over Elapsed
	PeakRSS int64         // the JVM's VmHWM at the end, bytes
}

func (r mm2Result) MBPerSec(recordSize int) float64 {
	return float64(r.Records*int64(recordSize)) / mib / r.Elapsed.Seconds()
}

// mm2Properties is MirrorMaker 2's configuration for copying topic from
// the source to the destination: the identity replication policy (the
// topic keeps its name, as in kmirror), one task per partition, and the
// producer tuned as the baseline producer is (batch.size, linger.ms,
// compression, acks=all).
//
// Each run has a source alias of its own ("src-" + label): MirrorMaker 2
// keeps its tasks and their committed source offsets in topics of the
// destination named after the alias, and a later run under the same alias
// would restart the earlier run's tasks from their last committed offsets,
// copying that topic's tail a second time (seen: the loopback run's
// tasks came back during the latency run and wrote duplicates into the
// topic kmirror had mirrored since, which kmirror named DIVERGED).
func (b *bench) mm2Properties(topic, label string) map[string]string {
	src := "src-" + label
	flow := src + "->destination"
	props := map[string]string{
		"clusters":                              src + ", destination",
		src + ".bootstrap.servers":              b.clientAddr(b.src),
		"destination.bootstrap.servers":         b.clientAddr(b.dst),
		flow + ".enabled":                       "true",
		flow + ".topics":                        topic,
		"destination->" + src + ".enabled":      "false",
		"replication.policy.class":              "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
		"tasks.max":                             fmt.Sprint(b.cfg.Partitions),
		"replication.factor":                    "1",
		"refresh.topics.interval.seconds":       "5",
		"destination.producer.acks":             "all",
		"destination.producer.compression.type": b.cfg.Compression,
		"destination.producer.batch.size":       fmt.Sprint(b.cfg.BatchSize),
		"destination.producer.linger.ms":        "20",
		"destination.producer.buffer.memory":    "268435456",
		"destination.producer.max.request.size": "16777216",
		// Connect's worker defaults to one request in flight per
		// connection; the idempotent producer keeps order with 5.
		"destination.producer.enable.idempotence":                    "true",
		"destination.producer.max.in.flight.requests.per.connection": "5",
		src + ".consumer.max.partition.fetch.bytes":                  "4194304",
		src + ".consumer.max.poll.records":                           "4000",
		// The kernel's autotuning instead of the consumer's 64 KiB, which
		// caps a fetch connection near 1.3 MB/s at 50 ms.
		src + ".consumer.receive.buffer.bytes": "-1",
	}
	for _, internal := range []string{"checkpoints.topic", "heartbeats.topic", "offset-syncs.topic", "offset.storage", "status.storage", "config.storage"} {
		props[internal+".replication.factor"] = "1"
	}
	for k, v := range b.clientProps() {
		if k == "sasl.jaas.config" {
			v = fmt.Sprintf(`org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="%s";`, benchUser, benchPassword)
		}
		props[src+"."+k] = v
		props["destination."+k] = v
	}
	return props
}

// mm2Process is one running MirrorMaker 2 JVM.
type mm2Process struct {
	pid     int
	logPath string
	exited  chan error // the JVM's exit; read once
	halted  bool
	stop    context.CancelFunc
}

// startMM2 launches MirrorMaker 2 copying topic, with its configuration
// and log in the bench folder under label.
func (b *bench) startMM2(ctx context.Context, topic, label string) (*mm2Process, error) {
	path := filepath.Join(b.dir, "mm2-"+label+".properties")
	if err := os.WriteFile(path, []byte(propertiesText(b.mm2Properties(topic, label))), 0o600); err != nil {
		return nil, err
	}
	logPath := filepath.Join(b.dir, "mm2-"+label+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	cmd := b.dst.JavaHeap(runCtx, "2g", mirrorMaker2Main, path) // connect-mirror-maker.sh's heap
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		stop()
		logf.Close()
		return nil, fmt.Errorf("starting MirrorMaker 2: %w", err)
	}
	p := &mm2Process{pid: cmd.Process.Pid, logPath: logPath, exited: make(chan error, 1), stop: stop}
	go func() {
		p.exited <- cmd.Wait()
		logf.Close()
	}()
	b.printf("MirrorMaker 2 pid %d started (config %s, log %s)", p.pid, path, logPath)
	return p, nil
}

// halt kills the JVM (its process group) and waits for it; once.
func (p *mm2Process) halt() {
	if !p.halted {
		p.halted = true
		p.stop()
		<-p.exited
	}
}

// exitError reports a JVM that exited by itself, with its log's last
// lines; nil while it runs.
func (p *mm2Process) exitError() error {
	select {
	case err := <-p.exited:
		p.halted = true
		p.stop()
		return fmt.Errorf("MirrorMaker 2 exited (%v); last lines of %s:\n%s", err, p.logPath, fileTail(p.logPath, 30))
	default:
		return nil
	}
}

// mm2LatencyPath runs the latency measurement through MirrorMaker 2, on a
// topic of its own (the identity policy keeps the name at the
// destination).
func (b *bench) mm2LatencyPath() latencyPath {
	var p *mm2Process
	return latencyPath{
		name: "MirrorMaker 2", topic: latencyTopic + "-mm2",
		start: func(ctx context.Context) (err error) {
			p, err = b.startMM2(ctx, latencyTopic+"-mm2", "latency")
			return err
		},
		stop: func() { p.halt() },
		sample: func() (procSample, error) {
			if err := p.exitError(); err != nil {
				return procSample{}, err
			}
			return sample(p.pid, b.ticks)
		},
	}
}

// mirrorMaker2 copies the backlog topic with MirrorMaker 2 in dedicated
// mode, times it against the destination's end offsets, then stops it and
// deletes the destination topic so kmirror mirrors the same backlog into a
// fresh one.
func (b *bench) mirrorMaker2(ctx context.Context, topic, label string) (mm2Result, error) {
	launched := time.Now()
	p, err := b.startMM2(ctx, topic, label)
	if err != nil {
		return mm2Result{}, err
	}
	defer p.halt()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.dst.Bootstrap(), ",")...))
	if err != nil {
		return mm2Result{}, err
	}
	defer cl.Close()
	want := b.cfg.Records()
	var (
		first      time.Time
		atFirst    procSample
		last       int64
		lastGrew   = time.Now()
		nextReport = time.Now().Add(progressPeriod)
	)
	for {
		if err := p.exitError(); err != nil {
			return mm2Result{}, err
		}
		if err := sleepCtx(ctx, pollInterval); err != nil {
			return mm2Result{}, err
		}
		sum, err := destinationRecords(ctx, cl, topic, b.cfg.Partitions)
		if err != nil {
			return mm2Result{}, err
		}
		now := time.Now()
		if sum > 0 && first.IsZero() {
			first = now
			if atFirst, err = sample(p.pid, b.ticks); err != nil {
				return mm2Result{}, err
			}
			b.printf("  first records at the destination %.1fs after MirrorMaker 2's launch", now.Sub(launched).Seconds())
		}
		if sum > last {
			last, lastGrew = sum, now
		} else if now.Sub(lastGrew) > stallTimeout {
			return mm2Result{}, fmt.Errorf("MirrorMaker 2 copied nothing for %v (%d of %d records); its log: %s", stallTimeout, sum, want, p.logPath)
		}
		if sum > want {
			return mm2Result{}, fmt.Errorf("the destination holds %d records of %s, more than the source's %d (MirrorMaker 2 duplicated records)", sum, topic, want)
		}
		if sum == want {
			end, err := sample(p.pid, b.ticks)
			if err != nil {
				return mm2Result{}, err
			}
			r := mm2Result{Records: want, Startup: first.Sub(launched), Elapsed: now.Sub(first), CPU: end.CPU - atFirst.CPU, PeakRSS: end.PeakRSS}
			p.halt()
			if err := deleteTopic(ctx, cl, topic); err != nil {
				return mm2Result{}, err
			}
			return r, nil
		}
		if now.After(nextReport) {
			nextReport = now.Add(progressPeriod)
			b.printf("  MirrorMaker 2 copied %d of %d records (%.0f%%)", sum, want, 100*float64(sum)/float64(want))
		}
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// destinationRecords sums topic's end offsets at the destination; 0 while
// the topic does not exist yet.
func destinationRecords(ctx context.Context, cl *kgo.Client, topic string, partitions int) (int64, error) {
	ends, err := endOffsets(ctx, cl, topic, partitions)
	if err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return 0, nil
		}
		return 0, err
	}
	var sum int64
	for _, e := range ends {
		sum += e
	}
	return sum, nil
}

// deleteTopic deletes topic and waits until the broker no longer lists it.
func deleteTopic(ctx context.Context, cl *kgo.Client, topic string) error {
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.TopicNames = []string{topic}
	rt := kmsg.NewDeleteTopicsRequestTopic()
	rt.Topic = &topic
	req.Topics = []kmsg.DeleteTopicsRequestTopic{rt}
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("deleting %s at the destination: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.ErrorCode != 0 {
			return fmt.Errorf("deleting %s at the destination: Kafka error code %d", topic, t.ErrorCode)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		mreq := kmsg.NewPtrMetadataRequest()
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = &topic
		mreq.Topics = []kmsg.MetadataRequestTopic{mt}
		mresp, err := mreq.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		if len(mresp.Topics) == 1 && mresp.Topics[0].ErrorCode == kerr.UnknownTopicOrPartition.Code {
			return nil
		}
		time.Sleep(pollInterval)
	}
	return fmt.Errorf("the destination still lists %s a minute after it was deleted", topic)
}

// fileTail returns the last n lines of the file at path.
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// runMM2 copies the backlog with MirrorMaker 2 across a 0 ms link and,
// with --rtt, its second backlog across the delay line; the line is at
// 0 ms again afterwards, for kmirror's loopback copy.
func (b *bench) runMM2(ctx context.Context) error {
	r, err := b.mirrorMaker2(ctx, backlogTopic, "loopback")
	if err != nil {
		return err
	}
	b.mm2 = &r
	b.printf("MirrorMaker 2: %d records in %.2fs after a %.1fs start: %.2f MB/s, %.2f CPU-s (%.2f CPU-s/GiB), peak RSS %.0f MiB; destination topic deleted for kmirror's run",
		r.Records, r.Elapsed.Seconds(), r.Startup.Seconds(), r.MBPerSec(b.cfg.RecordSize), r.CPU.Seconds(), r.CPU.Seconds()/b.payloadGiB(), float64(r.PeakRSS)/mib)
	if b.line == nil {
		return nil
	}
	b.line.SetRTT(b.cfg.RTT)
	defer b.line.SetRTT(0)
	b.printf("the delay line in front of the source now holds every packet %v each way (round trip %v)", b.cfg.RTT/2, b.cfg.RTT)
	w, err := b.mirrorMaker2(ctx, wanTopic, "wan")
	if err != nil {
		return err
	}
	b.mm2WAN = &w
	b.printf("MirrorMaker 2 across %v: %.2f MB/s, %.2f CPU-s/GiB; WAN/loopback %.2f",
		b.cfg.RTT, w.MBPerSec(b.cfg.RecordSize), w.CPU.Seconds()/b.payloadGiB(), w.MBPerSec(b.cfg.RecordSize)/r.MBPerSec(b.cfg.RecordSize))
	return nil
}
