package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

// Topic and mirror names; the clusters are the bench's own, so fixed names
// cannot collide.
const (
	backlogTopic  = "bench"
	wanTopic      = "bench-wan" // the same backlog, mirrored across --rtt
	baselineTopic = "baseline"
	latencyTopic  = "latency"
	mirrorName    = "bench"
)

const (
	mib = 1 << 20
	gib = 1 << 30
)

// bench runs the steps in order; each fills in its result.
type bench struct {
	cfg   config
	out   *lockedWriter
	start time.Time
	ticks int64  // USER_HZ, the unit of /proc CPU times
	dir   string // kept after the run: daemon config, data and log, Kafka logs

	src, dst *harness.Cluster
	line     *harness.DelayLine // in front of src with --rtt
	dstLine  *harness.DelayLine // in front of dst with --destination-rtt
	tls      tlsSetup           // --security sasl_ssl files
	logs     []*os.File         // the clusters' JVM output, closed after them
	group    *group

	fill     perfResult
	baseline perfResult
	mirror   mirrorResult
	wan      *mirrorResult  // --rtt: the copy across the delay line
	wanConns string         // --rtt: each member's fetch connections then
	latency  *latencyResult // nil when skipped
	mm2      *mm2Result     // nil with --skip-mm2
	mm2WAN   *mm2Result     // --rtt: MirrorMaker 2 across the delay line
	// mm2Latency is the latency run through MirrorMaker 2 (nil when
	// skipped).
	mm2Latency *latencyResult
	idle       *idleResult // nil when skipped
}

func newBench(cfg config, out io.Writer) *bench {
	return &bench{cfg: cfg, out: &lockedWriter{w: out}, ticks: clockTicks()}
}

// printf prints one line stamped with the time since the start.
func (b *bench) printf(format string, args ...any) {
	fmt.Fprintf(b.out, "[%7.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *bench) step(n int, format string, args ...any) {
	b.printf("step %d/8: %s", n, fmt.Sprintf(format, args...))
}

func (b *bench) run(ctx context.Context) (err error) {
	b.start = time.Now()
	if b.dir, err = os.MkdirTemp("", "kmirror-bench-"); err != nil {
		return err
	}
	b.printf("bench folder (kmirror config, raft data and log; Kafka logs), kept after the run: %s", b.dir)
	b.printf("backlog: %d records of %d bytes = %.1f MiB payload, %d partitions, %s compression",
		b.cfg.Records(), b.cfg.RecordSize, float64(b.cfg.Records()*int64(b.cfg.RecordSize))/mib, b.cfg.Partitions, b.cfg.Compression)
	defer func() {
		if err != nil {
			if ctx.Err() != nil {
				err = errors.New("interrupted: stopped whatever it had started (kmirror daemon, Kafka clusters, Java tools)")
			} else {
				b.explainFailure()
			}
		}
		b.teardown()
	}()

	b.step(1, "starting the source and destination Kafka clusters (1 broker each, JIT kept for throughput; clients use %s)", b.cfg.Security)
	if err := b.prepareSecurity(); err != nil {
		return err
	}
	if err := b.startClusters(ctx); err != nil {
		return err
	}

	b.step(2, "filling the source backlog: ProducerPerformance into %s/%s", "source", backlogTopic)
	if err := b.src.CreateTopic(ctx, backlogTopic, b.cfg.Partitions, 1, nil); err != nil {
		return err
	}
	if b.fill, err = b.producerPerformance(ctx, b.src, backlogTopic); err != nil {
		return err
	}
	b.printf("source backlog filled: %s", b.fill.Summary)
	if b.line != nil {
		if err := b.src.CreateTopic(ctx, wanTopic, b.cfg.Partitions, 1, nil); err != nil {
			return err
		}
		wfill, err := b.producerPerformance(ctx, b.src, wanTopic)
		if err != nil {
			return err
		}
		b.printf("second backlog for the copy across %v filled: %s", b.cfg.RTT, wfill.Summary)
	}

	b.step(3, "baseline (a): the same ProducerPerformance run into %s/%s", "destination", baselineTopic)
	if err := b.dst.CreateTopic(ctx, baselineTopic, b.cfg.Partitions, 1, nil); err != nil {
		return err
	}
	if b.baseline, err = b.producerPerformance(ctx, b.dst, baselineTopic); err != nil {
		return err
	}
	b.printf("baseline: %.2f MB/s, %.0f records/s (the producer JVM used %.1f CPU-s, %.2f CPU-s/GiB)",
		b.baseline.MBPerSec, b.baseline.RecordsPerSec, b.baseline.CPUSeconds, b.baseline.CPUSeconds/b.payloadGiB())

	if b.cfg.SkipMM2 {
		b.step(4, "MirrorMaker 2: skipped (--skip-mm2)")
	} else {
		b.step(4, "MirrorMaker 2 (c): copying the source backlog %s with its identity replication policy (dedicated mode, %d tasks)", backlogTopic, b.cfg.Partitions)
		if err := b.runMM2(ctx); err != nil {
			return err
		}
	}

	b.step(5, "kmirror (b): mirroring the source backlog %s into the destination with %d members", backlogTopic, b.cfg.Members)
	if b.group, err = startGroup(ctx, b.cfg.Kmirror, b.dir, b.clientAddr(b.dst), b.destinationYAML(), b.memberYAML(), b.cfg.Members, b.cfg.CPUProfile); err != nil {
		return err
	}
	for _, m := range b.group.members {
		b.printf("kmirror daemon %s pid %d ready; log %s", m.id, m.pid(), m.logPath)
	}
	if err := b.createMirror(ctx); err != nil {
		return err
	}
	if b.mirror, err = b.mirrorBacklog(ctx, backlogTopic); err != nil {
		return err
	}
	b.printf("kmirror: %d records in %.2fs: %.2f MB/s, %.0f records/s, %.2f CPU-s (%.2f CPU-s/GiB, all members), peak RSS %.0f MiB (largest member), ratio to baseline %.2f",
		b.mirror.Records, b.mirror.Elapsed.Seconds(), b.mirror.MBPerSec(b.cfg.RecordSize), b.mirror.RecordsPerSec(),
		b.mirror.CPU.Seconds(), b.mirror.CPU.Seconds()/b.payloadGiB(), float64(b.mirror.PeakRSS)/mib, b.ratio())
	if b.line != nil {
		b.line.SetRTT(b.cfg.RTT)
		b.printf("the delay line in front of the source now holds every packet %v each way (round trip %v)", b.cfg.RTT/2, b.cfg.RTT)
		wan, err := b.mirrorBacklog(ctx, wanTopic)
		if err != nil {
			return err
		}
		b.wan = &wan
		b.wanConns = b.fetchConnections()
		b.printf("kmirror across %v: %d records in %.2fs: %.2f MB/s, %.2f CPU-s/GiB; WAN/loopback %.2f; fetch connections per source broker at the end: %s",
			b.cfg.RTT, wan.Records, wan.Elapsed.Seconds(), wan.MBPerSec(b.cfg.RecordSize), wan.CPU.Seconds()/b.payloadGiB(),
			wan.MBPerSec(b.cfg.RecordSize)/b.mirror.MBPerSec(b.cfg.RecordSize), b.wanConns)
	}

	if b.cfg.SkipLatency {
		b.step(6, "latency: skipped (--skip-latency)")
	} else {
		b.step(6, "latency: %s/s of %d-byte records for %ds through kmirror (producer linger %s)",
			formatSize(b.cfg.LatencyRate), b.cfg.RecordSize, b.cfg.LatencySeconds, b.cfg.LatencyLinger)
		lat, err := b.measureLatency(ctx, b.kmirrorLatencyPath())
		if err != nil {
			return err
		}
		b.latency = &lat
		if !b.cfg.SkipMM2 {
			b.printf("the same through MirrorMaker 2, on a topic of its own")
			lat, err := b.measureLatency(ctx, b.mm2LatencyPath())
			if err != nil {
				return err
			}
			b.mm2Latency = &lat
		}
	}

	if b.cfg.IdlePartitions == 0 {
		b.step(7, "idle partitions: skipped (--idle-partitions 0)")
	} else {
		b.step(7, "idle: CPU of kmirror and both brokers over %ds, before and after mirroring %d empty partitions", b.cfg.IdleSeconds, b.cfg.IdlePartitions)
		idle, err := b.measureIdle(ctx)
		if err != nil {
			return err
		}
		b.idle = &idle
	}

	b.step(8, "stopping the kmirror daemons (SIGTERM) and the clusters")
	g := b.group
	b.group = nil // stop kills them if SIGTERM is not enough
	stopErr := g.stop()
	if stopErr == nil {
		b.printf("kmirror daemons exited cleanly")
	}
	for _, m := range g.members {
		b.reportLogProblems(m)
		if stopErr == nil && m.profile != "" {
			b.printProfile(m)
		}
	}
	b.closeClusters()
	b.printSummary()
	if stopErr != nil {
		for _, m := range g.members {
			b.printf("kmirror daemon %s log %s (last lines):\n%s", m.id, m.logPath, m.logTail(40))
		}
	}
	return stopErr
}

// startClusters starts both clusters at once; their JVM output goes to
// files in the bench folder.
func (b *bench) startClusters(ctx context.Context) error {
	names := []string{"source", "destination"}
	for _, name := range names {
		logf, err := os.Create(filepath.Join(b.dir, name+"-kafka.log"))
		if err != nil {
			return err
		}
		b.logs = append(b.logs, logf)
	}
	if b.cfg.RTT > 0 {
		// At 0 ms until the loopback copy is done (SetRTT).
		line, err := harness.NewDelayLine(0)
		if err != nil {
			return fmt.Errorf("--rtt: %w", err)
		}
		b.line = line
		if n := b.cfg.SourceTCPWmemMax; n > 0 {
			wmem := fmt.Sprintf("net.ipv4.tcp_wmem=4096 16384 %d", n)
			if out, err := line.Command("sysctl", "-w", wmem).CombinedOutput(); err != nil {
				return fmt.Errorf("--source-tcp-wmem-max: sysctl -w %s in the source's namespace: %v: %s", wmem, err, strings.TrimSpace(string(out)))
			}
		}
	}
	if b.cfg.DestinationRTT > 0 {
		line, err := harness.NewDelayLine(b.cfg.DestinationRTT)
		if err != nil {
			return fmt.Errorf("--destination-rtt: %w", err)
		}
		b.dstLine = line
	}
	var (
		wg   sync.WaitGroup
		errs [2]error
	)
	for i, name := range names {
		wg.Go(func() {
			o := b.clusterOptions(harness.Options{Name: name, Throughput: true, Log: b.logs[i]})
			if i == 0 {
				o.DelayLine = b.line
				if b.cfg.SourceSendBuffer != 0 {
					o.BrokerProps = map[string]string{"socket.send.buffer.bytes": fmt.Sprint(b.cfg.SourceSendBuffer)}
				}
			} else if b.dstLine != nil {
				o.DelayLine = b.dstLine
				// Kafka's default receive buffer (100 KiB) would cap every
				// connection at 100 KiB per round trip, the baseline's and
				// kmirror's alike, and hide the produce window.
				o.BrokerProps = map[string]string{"socket.receive.buffer.bytes": "-1"}
			}
			cl, err := harness.Start(ctx, o)
			if err != nil {
				errs[i] = fmt.Errorf("starting the %s cluster: %w", name, err)
				return
			}
			if i == 0 {
				b.src = cl
			} else {
				b.dst = cl
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	b.printf("source %s, destination %s", b.src.Bootstrap(), b.dst.Bootstrap())
	if b.dstLine != nil {
		b.printf("the destination is behind a delay line of %v round trip (every write to it crosses it)", b.cfg.DestinationRTT)
	}
	return nil
}

// teardown kills whatever still runs; it is a no-op after a clean step 6.
func (b *bench) teardown() {
	if b.group != nil {
		b.group.kill()
		b.group = nil
	}
	b.closeClusters()
}

func (b *bench) closeClusters() {
	for _, cl := range []*harness.Cluster{b.src, b.dst} {
		if cl != nil {
			if err := cl.Close(); err != nil {
				b.printf("closing a cluster: %v", err)
			}
		}
	}
	b.src, b.dst = nil, nil
	for _, l := range []**harness.DelayLine{&b.line, &b.dstLine} {
		if *l != nil {
			if err := (*l).Close(); err != nil {
				b.printf("closing a delay line: %v", err)
			}
			*l = nil
		}
	}
	for _, f := range b.logs {
		f.Close()
	}
	b.logs = nil
}

// explainFailure prints what helps to see why a step failed.
func (b *bench) explainFailure() {
	if b.group != nil {
		for _, m := range b.group.members {
			b.printf("kmirror daemon %s log %s (last lines):\n%s", m.id, m.logPath, m.logTail(40))
		}
	}
	b.printf("Kafka logs: %s", filepath.Join(b.dir, "{source,destination}-kafka.log"))
}

// reportLogProblems prints the daemon log's warnings and errors, if any:
// a clean benchmark run should have none.
func (b *bench) reportLogProblems(m *member) {
	lines, n := m.logProblems(10)
	if n == 0 {
		b.printf("kmirror daemon log: no warnings or errors")
		return
	}
	b.printf("kmirror daemon log: %d warning/error lines; the first %d:", n, len(lines))
	for _, l := range lines {
		fmt.Fprintf(b.out, "    %s\n", l)
	}
}

func (b *bench) printSummary() {
	var s strings.Builder
	fmt.Fprintf(&s, "\n== summary: %s payload in %d-byte records, %d partitions, %s, clients over %s; MB = 2^20 bytes (as ProducerPerformance counts) ==\n",
		formatSize(b.cfg.Bytes), b.cfg.RecordSize, b.cfg.Partitions, b.cfg.Compression, b.cfg.Security)
	fmt.Fprintf(&s, "baseline (Java producer → destination): %.2f MB/s, %.0f rec/s\n", b.baseline.MBPerSec, b.baseline.RecordsPerSec)
	fmt.Fprintf(&s, "kmirror (source backlog → destination): %.2f MB/s, %.0f rec/s, %.2f CPU-s/GiB, peak RSS %.0f MiB\n",
		b.mirror.MBPerSec(b.cfg.RecordSize), b.mirror.RecordsPerSec(), b.mirror.CPU.Seconds()/b.payloadGiB(), float64(b.mirror.PeakRSS)/mib)
	fmt.Fprintf(&s, "ratio kmirror/baseline: %.2f  (target ≥ 0.5)\n", b.ratio())
	if b.cfg.DestinationRTT > 0 {
		window := "kmirror's default"
		if b.cfg.ProduceWindow > 0 {
			window = fmt.Sprint(b.cfg.ProduceWindow)
		}
		fmt.Fprintf(&s, "(the destination across a %v round trip, its socket.receive.buffer.bytes -1: the baseline and kmirror wrote across it; batch.size %d; produce_window %s)\n", b.cfg.DestinationRTT, b.cfg.BatchSize, window)
	}
	if w := b.wan; w != nil {
		buf := "Kafka's default 102400 bytes"
		switch n := b.cfg.SourceSendBuffer; {
		case n < 0:
			buf = "the kernel's autotuning"
			if m := b.cfg.SourceTCPWmemMax; m > 0 {
				buf += fmt.Sprintf(" up to %d bytes", m)
			}
		case n > 0:
			buf = fmt.Sprintf("%d bytes", n)
		}
		fmt.Fprintf(&s, "kmirror across a %v round trip (source socket.send.buffer.bytes: %s): %.2f MB/s, %.2f CPU-s/GiB; WAN/loopback %.2f (loopback through the same relay at 0 ms); fetch connections %s\n",
			b.cfg.RTT, buf, w.MBPerSec(b.cfg.RecordSize), w.CPU.Seconds()/b.payloadGiB(), w.MBPerSec(b.cfg.RecordSize)/b.mirror.MBPerSec(b.cfg.RecordSize), b.wanConns)
	}
	if m := b.mm2; m != nil {
		km := b.mirror.CopyMBPerSec(b.cfg.RecordSize)
		fmt.Fprintf(&s, "MirrorMaker 2 (same backlog, identity policy, %d tasks): %.2f MB/s from its first record to its last (first record %.1fs after launch), %.2f CPU-s/GiB, peak RSS %.0f MiB\n",
			b.cfg.Partitions, m.MBPerSec(b.cfg.RecordSize), m.Startup.Seconds(), m.CPU.Seconds()/b.payloadGiB(), float64(m.PeakRSS)/mib)
		fmt.Fprintf(&s, "  kmirror timed the same way: %.2f MB/s from its first record to its last (first record %.1fs after add); kmirror/MM2: %.2fx MB/s, %.2fx CPU-s/GiB, %.2fx peak RSS\n",
			km, b.mirror.FirstRecord.Seconds(), km/m.MBPerSec(b.cfg.RecordSize), b.mirror.CPU.Seconds()/m.CPU.Seconds(), float64(b.mirror.PeakRSS)/float64(m.PeakRSS))
		if w := b.mm2WAN; w != nil {
			fmt.Fprintf(&s, "MirrorMaker 2 across %v: %.2f MB/s, %.2f CPU-s/GiB; WAN/loopback %.2f\n",
				b.cfg.RTT, w.MBPerSec(b.cfg.RecordSize), w.CPU.Seconds()/b.payloadGiB(), w.MBPerSec(b.cfg.RecordSize)/m.MBPerSec(b.cfg.RecordSize))
		}
	}
	if l := b.latency; l != nil {
		fmt.Fprintf(&s, "latency at %s/s: p50 %.1f ms, p99 %.1f ms  (max %.1f ms over %d records; producer send → destination consumer receive; linger %s)\n",
			formatSize(b.cfg.LatencyRate), ms(l.Mirrored.P50), ms(l.Mirrored.P99), ms(l.Mirrored.Max), l.Mirrored.Records, b.cfg.LatencyLinger)
		fmt.Fprintf(&s, "  the same records read from the source (no kmirror): p50 %.1f ms, p99 %.1f ms\n", ms(l.Source.P50), ms(l.Source.P99))
		fmt.Fprintf(&s, "  added by kmirror: p50 %+.1f ms, p99 %+.1f ms\n", ms(l.Mirrored.P50-l.Source.P50), ms(l.Mirrored.P99-l.Source.P99))
		if d := l.Direct; d.Records > 0 && len(d.P50BySecond) > 0 && len(l.Source.P50BySecond) > 0 && len(l.Mirrored.P50BySecond) > 0 {
			fmt.Fprintf(&s, "  the same records straight into the destination (no mirror): p50 %.1f ms, p99 %.1f ms; first second's p50: %.0f ms direct, %.0f ms source, %.0f ms through kmirror\n",
				ms(d.P50), ms(d.P99), ms(d.P50BySecond[0]), ms(l.Source.P50BySecond[0]), ms(l.Mirrored.P50BySecond[0]))
		}
		if m := b.mm2Latency; m != nil {
			fmt.Fprintf(&s, "  through MirrorMaker 2 (its own topic, same rate): p50 %.1f ms, p99 %.1f ms; added p50 %+.1f ms, p99 %+.1f ms (source read p50 %.1f ms, p99 %.1f ms)\n",
				ms(m.Mirrored.P50), ms(m.Mirrored.P99), ms(m.Mirrored.P50-m.Source.P50), ms(m.Mirrored.P99-m.Source.P99), ms(m.Source.P50), ms(m.Source.P99))
		}
	} else {
		s.WriteString("latency: skipped\n")
	}
	if i := b.idle; i != nil {
		fmt.Fprintf(&s, "idle, %d empty partitions mirrored (%d members): kmirror %.1f%% of a core (before %.1f%%), source broker %.1f%% (before %.1f%%, %+.1f), destination broker %.1f%% (before %.1f%%, %+.1f); %ds windows\n",
			i.Partitions, b.cfg.Members, 100*i.After.Kmirror, 100*i.Before.Kmirror, 100*i.After.Source, 100*i.Before.Source, 100*(i.After.Source-i.Before.Source),
			100*i.After.Destination, 100*i.Before.Destination, 100*(i.After.Destination-i.Before.Destination), b.cfg.IdleSeconds)
	}
	io.WriteString(b.out, s.String())
}

// payloadGiB is the backlog's payload in GiB, the unit of CPU-s/GiB.
func (b *bench) payloadGiB() float64 {
	return float64(b.cfg.Records()*int64(b.cfg.RecordSize)) / gib
}

func (b *bench) ratio() float64 {
	if b.baseline.MBPerSec == 0 {
		return 0
	}
	return b.mirror.MBPerSec(b.cfg.RecordSize) / b.baseline.MBPerSec
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// formatSize writes n in the largest unit that divides it, such as 1GiB or
// 5MB.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		bytes  int64
	}{{"GiB", 1 << 30}, {"GB", 1e9}, {"MiB", 1 << 20}, {"MB", 1e6}, {"KiB", 1 << 10}, {"KB", 1e3}} {
		if n != 0 && n%u.bytes == 0 {
			return fmt.Sprintf("%d%s", n/u.bytes, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// lockedWriter serialises writes from the goroutines that echo tool output.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// printProfile prints the functions that took most of a member's CPU
// (go tool pprof -top), from the profile it wrote over its whole run.
func (b *bench) printProfile(m *member) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", b.cfg.Kmirror, m.profile).CombinedOutput()
	if err != nil {
		b.printf("kmirror daemon %s CPU profile %s: go tool pprof: %v\n%s", m.id, m.profile, err, out)
		return
	}
	b.printf("kmirror daemon %s CPU profile %s (whole run), top functions:\n%s", m.id, m.profile, out)
}

// fetchConnections says how many fetch connections each member keeps to
// each source broker, from their logs: "bench-1: 10.201.1.2:9092=6".
func (b *bench) fetchConnections() string {
	var parts []string
	for _, m := range b.group.members {
		conns := m.fetchConnections()
		brokers := make([]string, 0, len(conns))
		for addr, n := range conns {
			brokers = append(brokers, fmt.Sprintf("%s=%d", addr, n))
		}
		sort.Strings(brokers)
		parts = append(parts, fmt.Sprintf("%s: %s", m.id, strings.Join(brokers, " ")))
	}
	return strings.Join(parts, "; ")
}
