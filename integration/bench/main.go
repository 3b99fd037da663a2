// Command bench measures kmirror against a baseline on real Apache Kafka
// and prints the figures; it asserts nothing about wall-clock time, which
// depends on the machine. Run it with `make bench` (BENCH_FLAGS=... for the
// flags below).
//
// It starts a source and a destination cluster, fills a backlog in the
// source with Kafka's own ProducerPerformance tool, runs the same tool
// against the destination as the baseline (how fast the destination can
// take these records from a Java producer), then lets a kmirror daemon copy
// the backlog and compares. Last it measures end-to-end latency at a
// steady produce rate through kmirror.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the bench cleans up; a second one kills it at
	// once (its JVMs and daemon die with it through their parent-death
	// signal).
	go func() {
		<-ctx.Done()
		stop()
	}()
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses args into a config, runs the benchmark and returns the exit
// code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := &cli.App{
		Name:        "bench",
		Usage:       "measure kmirror throughput, CPU, memory and latency against a Kafka Java producer baseline",
		HideVersion: true,
		Writer:      stdout,
		ErrWriter:   stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "bytes", Value: "1GiB", Usage: "total payload `SIZE` of the source backlog (units B, KB, MB, GB, KiB, MiB, GiB)"},
			&cli.IntFlag{Name: "record-size", Value: 1024, Usage: "record value size in `BYTES`"},
			&cli.IntFlag{Name: "partitions", Value: 8, Usage: "`COUNT` of partitions of every benchmark topic"},
			&cli.StringFlag{Name: "compression", Value: "lz4", Usage: "producer compression `CODEC`: none, gzip, snappy, lz4 or zstd"},
			&cli.StringFlag{Name: "latency-rate", Value: "5MB", Usage: "payload `SIZE` per second produced during the latency run"},
			&cli.IntFlag{Name: "latency-seconds", Value: 30, Usage: "length of the latency run in `SECONDS`"},
			&cli.BoolFlag{Name: "latency-direct", Usage: "the latency run also produces each record straight into a fresh destination topic and reads it there: the destination broker's own share of the latency (doubles the run's load)"},
			&cli.DurationFlag{Name: "latency-linger", Value: 5 * time.Millisecond, Usage: "linger of the latency run's producer (`DURATION`; the Java client's default since Kafka 4.0 is 5ms; 0 sends the smallest batches)"},
			&cli.StringFlag{Name: "kmirror", Value: "bin/kmirror", Usage: "kmirror binary `PATH`"},
			&cli.BoolFlag{Name: "skip-latency", Usage: "skip the latency run"},
			&cli.IntFlag{Name: "idle-partitions", Value: 10000, Usage: "`COUNT` of empty partitions mirrored last, with kmirror's and both brokers' CPU measured before and after (0 skips it)"},
			&cli.IntFlag{Name: "idle-seconds", Value: 30, Usage: "length of each idle CPU measurement in `SECONDS`"},
			&cli.BoolFlag{Name: "skip-mm2", Usage: "skip the MirrorMaker 2 runs (the comparison baseline)"},
			&cli.IntFlag{Name: "members", Value: 3, Usage: "`COUNT` of kmirror members in the group (1 for the single-member figure)"},
			&cli.DurationFlag{Name: "rtt", Usage: "put the source cluster behind a delay line of this round trip (`DURATION`, such as 50ms; needs root) and mirror the backlog across a 0 ms link and across it"},
			&cli.IntFlag{Name: "batch-size", Value: 262144, Usage: "batch.size of the producers that fill the backlog and run the baseline (`BYTES`; small batches show what --produce-window does)"},
			&cli.DurationFlag{Name: "destination-rtt", Usage: "put the destination cluster behind a delay line of this round trip (`DURATION`, such as 5ms; needs root) for the whole run, to show what --produce-window hides"},
			&cli.IntFlag{Name: "source-send-buffer", Usage: "the source broker's socket.send.buffer.bytes (`BYTES`; 0: Kafka's default 102400, -1: the kernel's autotuning up to net.ipv4.tcp_wmem's maximum)"},
			&cli.IntFlag{Name: "source-tcp-wmem-max", Usage: "with --rtt: the most send-buffer autotuning gives a connection in the source's namespace (`BYTES`, net.ipv4.tcp_wmem's maximum, such as 33554432; 0: the host's, 4 MiB on stock kernels)"},
			&cli.IntFlag{Name: "produce-window", Usage: "kmirror's produce_window (`COUNT` of produce requests awaiting answers per destination connection, 1-5; 0: kmirror's default)"},
			&cli.BoolFlag{Name: "cpu-profile", Usage: "each kmirror member writes a Go CPU profile of its run into the bench folder; the top functions are printed at the end"},
			&cli.StringFlag{Name: "security", Value: securityPlaintext, Usage: "`MODE` of the connections under test: plaintext, or sasl_ssl (TLS and SCRAM-SHA-512 for kmirror and the baseline producer on both clusters)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected argument %q: bench takes flags only (see --help)", c.Args().First())
			}
			cfg, err := configFromFlags(c)
			if err != nil {
				return err
			}
			return newBench(cfg, stdout).run(c.Context)
		},
	}
	if err := app.RunContext(ctx, args); err != nil {
		fmt.Fprintf(stderr, "bench: %s\n", strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "\n  "))
		return 1
	}
	return 0
}

func configFromFlags(c *cli.Context) (config, error) {
	total, err := parseSize(c.String("bytes"))
	if err != nil {
		return config{}, fmt.Errorf("--bytes: %w", err)
	}
	rate, err := parseSize(c.String("latency-rate"))
	if err != nil {
		return config{}, fmt.Errorf("--latency-rate: %w", err)
	}
	cfg := config{
		Bytes:            total,
		RecordSize:       c.Int("record-size"),
		Partitions:       c.Int("partitions"),
		Compression:      c.String("compression"),
		LatencyRate:      rate,
		LatencySeconds:   c.Int("latency-seconds"),
		LatencyLinger:    c.Duration("latency-linger"),
		LatencyDirect:    c.Bool("latency-direct"),
		Kmirror:          c.String("kmirror"),
		SkipLatency:      c.Bool("skip-latency"),
		SkipMM2:          c.Bool("skip-mm2"),
		IdlePartitions:   c.Int("idle-partitions"),
		IdleSeconds:      c.Int("idle-seconds"),
		Members:          c.Int("members"),
		Security:         c.String("security"),
		CPUProfile:       c.Bool("cpu-profile"),
		ProduceWindow:    c.Int("produce-window"),
		RTT:              c.Duration("rtt"),
		SourceSendBuffer: c.Int("source-send-buffer"),
		SourceTCPWmemMax: c.Int("source-tcp-wmem-max"),
		DestinationRTT:   c.Duration("destination-rtt"),
		BatchSize:        c.Int("batch-size"),
	}
	return cfg, cfg.Validate()
}
