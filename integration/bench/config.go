package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// config is what the flags ask for.
type config struct {
	Bytes          int64 // payload bytes of the source backlog
	RecordSize     int   // value bytes per record
	Partitions     int
	Compression    string // producer compression.type
	LatencyRate    int64  // payload bytes per second of the latency run
	LatencySeconds int
	LatencyLinger  time.Duration // producer linger of the latency run
	// LatencyDirect also produces each latency record straight into a
	// fresh topic on the destination and reads it back there: the
	// destination broker's own share of a new topic's latency, which a
	// record through a mirror pays on top of the source's.
	LatencyDirect bool
	Kmirror       string // path of the kmirror binary
	SkipLatency   bool
	SkipMM2       bool // no MirrorMaker 2 run
	// IdlePartitions empty partitions are mirrored last, and kmirror's
	// and both brokers' CPU measured over IdleSeconds before and after
	// (0: skipped).
	IdlePartitions int
	IdleSeconds    int
	Members        int // kmirror members in the group
	// Security is plaintext or sasl_ssl: every client of the clusters
	// under test (kmirror, the baseline producer) on a SASL_SSL listener
	// with SCRAM-SHA-512.
	Security string
	// CPUProfile: each member writes a Go CPU profile, summarised at the
	// end (the top functions by CPU).
	CPUProfile bool
	// ProduceWindow is kmirror's produce_window (0: its default).
	ProduceWindow int
	// RTT > 0 puts the source cluster behind a delay line
	// (harness.DelayLine): the backlog is mirrored once across a 0 ms
	// link and once, from a second topic of the same size, across RTT.
	RTT time.Duration
	// DestinationRTT > 0 puts the destination cluster behind a delay line
	// of its own for the whole run: every write to it (the baseline, the
	// copies, the latency run) crosses it, which shows what the produce
	// window (ProduceWindow) hides on real brokers.
	DestinationRTT time.Duration
	// BatchSize is the batch.size of the producers that fill the backlog
	// and run the baseline (bytes): small batches show what the produce
	// window does (one batch per partition per produce request).
	BatchSize int
	// SourceSendBuffer is the source broker's socket.send.buffer.bytes
	// (0: Kafka's default, 102400; -1: the kernel's autotuning).
	SourceSendBuffer int
	// SourceTCPWmemMax > 0 sets the most the kernel's send-buffer
	// autotuning gives one connection (net.ipv4.tcp_wmem's maximum, bytes)
	// in the source's network namespace (with RTT): a source host tuned
	// for long links. 0 keeps the host's (4 MiB on stock kernels).
	SourceTCPWmemMax int
}

var compressions = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// maxRecordSize keeps a record and its batch overhead under the brokers'
// default message.max.bytes (1 MiB).
const maxRecordSize = 512 << 10

// Validate names every flag that is out of range and what it accepts.
func (c config) Validate() error {
	var errs []error
	if c.RTT < 0 || c.RTT > 2*time.Second {
		errs = append(errs, fmt.Errorf("--rtt %v: use 0 (no delay line) up to 2s, such as 50ms", c.RTT))
	}
	if c.RTT > 0 && c.Security != securityPlaintext {
		errs = append(errs, fmt.Errorf("--rtt with --security %s: the delay line runs plaintext clusters only", c.Security))
	}
	if c.DestinationRTT < 0 || c.DestinationRTT > 2*time.Second {
		errs = append(errs, fmt.Errorf("--destination-rtt %v: use 0 (no delay line) up to 2s, such as 5ms", c.DestinationRTT))
	}
	if c.DestinationRTT > 0 && c.Security != securityPlaintext {
		errs = append(errs, fmt.Errorf("--destination-rtt with --security %s: the delay line runs plaintext clusters only", c.Security))
	}
	if c.BatchSize < 1 || c.BatchSize > 16<<20 {
		errs = append(errs, fmt.Errorf("--batch-size %d: use 1 to 16777216 bytes, such as 262144", c.BatchSize))
	}
	if c.ProduceWindow < 0 || c.ProduceWindow > 5 {
		errs = append(errs, fmt.Errorf("--produce-window %d: use 0 (kmirror's default) or 1 to 5", c.ProduceWindow))
	}
	if c.IdlePartitions < 0 || c.IdlePartitions > 100000 {
		errs = append(errs, fmt.Errorf("--idle-partitions %d: use 0 (skip the idle measurement) up to 100000", c.IdlePartitions))
	}
	if c.IdleSeconds < 1 || c.IdleSeconds > 600 {
		errs = append(errs, fmt.Errorf("--idle-seconds %d: use 1 to 600", c.IdleSeconds))
	}
	if c.SourceSendBuffer < -1 {
		errs = append(errs, fmt.Errorf("--source-send-buffer %d: use -1 (the kernel's autotuning), 0 (Kafka's default) or a size in bytes", c.SourceSendBuffer))
	}
	if c.SourceTCPWmemMax < 0 || (c.SourceTCPWmemMax > 0 && c.RTT == 0) {
		errs = append(errs, fmt.Errorf("--source-tcp-wmem-max %d: use a size in bytes (such as 33554432) with --rtt, or 0 for the host's", c.SourceTCPWmemMax))
	}
	if c.SourceTCPWmemMax > 0 && c.SourceSendBuffer != -1 {
		errs = append(errs, fmt.Errorf("--source-tcp-wmem-max %d: add --source-send-buffer -1: the limit is autotuning's, and a fixed socket.send.buffer.bytes turns autotuning off", c.SourceTCPWmemMax))
	}
	if c.RecordSize < 1 || c.RecordSize > maxRecordSize {
		errs = append(errs, fmt.Errorf("--record-size %d: use 1 to %d bytes", c.RecordSize, maxRecordSize))
	}
	if c.Bytes < int64(max(c.RecordSize, 1)) {
		errs = append(errs, fmt.Errorf("--bytes %d: use at least one record (--record-size %d), such as 64MiB or 1GiB", c.Bytes, c.RecordSize))
	}
	if c.Partitions < 1 || c.Partitions > 1024 {
		errs = append(errs, fmt.Errorf("--partitions %d: use 1 to 1024", c.Partitions))
	}
	if c.Members < 1 || c.Members > 5 {
		errs = append(errs, fmt.Errorf("--members %d: use 1 to 5", c.Members))
	}
	if !contains(securityModes, c.Security) {
		errs = append(errs, fmt.Errorf("--security %q: use plaintext or sasl_ssl", c.Security))
	}
	if !contains(compressions, c.Compression) {
		errs = append(errs, fmt.Errorf("--compression %q: use one of %s", c.Compression, strings.Join(compressions, ", ")))
	}
	if !c.SkipLatency {
		if c.LatencyRate < int64(max(c.RecordSize, 1)) {
			errs = append(errs, fmt.Errorf("--latency-rate %d bytes/s: use at least one record per second (--record-size %d), such as 5MB", c.LatencyRate, c.RecordSize))
		}
		if c.LatencySeconds < 1 {
			errs = append(errs, fmt.Errorf("--latency-seconds %d: use 1 or more", c.LatencySeconds))
		}
		if c.LatencyLinger < 0 || c.LatencyLinger > time.Second {
			errs = append(errs, fmt.Errorf("--latency-linger %s: use 0 to 1s, such as 5ms", c.LatencyLinger))
		}
	}
	if st, err := os.Stat(c.Kmirror); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		errs = append(errs, fmt.Errorf("--kmirror %q is not an executable file: build it with `make build` or point --kmirror at the binary", c.Kmirror))
	}
	return errors.Join(errs...)
}

// Records is the backlog's record count.
func (c config) Records() int64 {
	return c.Bytes / int64(c.RecordSize)
}

// LatencyRecordsPerSecond is the produce rate of the latency run.
func (c config) LatencyRecordsPerSecond() float64 {
	return float64(c.LatencyRate) / float64(c.RecordSize)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// sizeUnits are decimal (KB, MB, GB) and binary (KiB, MiB, GiB) units;
// longer suffixes come first so that "MiB" is not read as "B".
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
	{"B", 1},
}

// parseSize reads a whole number of bytes with an optional unit, such as
// 1GiB, 64MiB, 5MB or 1024.
func parseSize(s string) (int64, error) {
	text := strings.TrimSpace(s)
	unit := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(text, u.suffix) {
			text, unit = strings.TrimSpace(strings.TrimSuffix(text, u.suffix)), u.bytes
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/unit {
		return 0, fmt.Errorf("invalid size %q: want a whole number with an optional unit B, KB, MB, GB, KiB, MiB or GiB, such as 64MiB", s)
	}
	return n * unit, nil
}
