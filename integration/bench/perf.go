package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/kmirror/kmirror/integration/harness"
)

// perfResult is what one ProducerPerformance run reports.
type perfResult struct {
	Records       int64
	RecordsPerSec float64
	// MBPerSec is in MiB/s: ProducerPerformance divides bytes by 2^20 and
	// calls it MB.
	MBPerSec float64
	// Summary is the tool's final line, as printed.
	Summary string
	// CPUSeconds is the user+system time of the producer JVM.
	CPUSeconds float64
}

// summaryLine matches the start of ProducerPerformance's progress and final
// lines: "N records sent, X records/sec (Y MB/sec), ...". Only the final
// one goes on to the latency percentiles ("ms 50th").
var summaryLine = regexp.MustCompile(`^(\d+) records sent, ([0-9.]+) records/sec \(([0-9.]+) MB/sec\)`)

// parseSummary reads the final line of a ProducerPerformance run.
func parseSummary(line string) (perfResult, bool) {
	m := summaryLine.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil || !strings.Contains(line, "50th") {
		return perfResult{}, false
	}
	n, err1 := strconv.ParseInt(m[1], 10, 64)
	rps, err2 := strconv.ParseFloat(m[2], 64)
	mbps, err3 := strconv.ParseFloat(m[3], 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return perfResult{}, false
	}
	return perfResult{Records: n, RecordsPerSec: rps, MBPerSec: mbps, Summary: strings.TrimSpace(line)}, true
}

// producerPerformance sends the configured records into topic of cl with
// Kafka's ProducerPerformance tool at full speed, echoing its output
// indented, and returns its final summary.
func (b *bench) producerPerformance(ctx context.Context, cl *harness.Cluster, topic string) (perfResult, error) {
	args := []string{"--topic", topic,
		"--num-records", strconv.FormatInt(b.cfg.Records(), 10),
		"--record-size", strconv.Itoa(b.cfg.RecordSize),
		"--throughput", "-1"}
	if cfgFile, err := b.producerConfig(); err != nil {
		return perfResult{}, err
	} else if cfgFile != "" {
		args = append(args, "--producer.config", cfgFile)
	}
	args = append(args, "--producer-props",
		"bootstrap.servers="+b.clientAddr(cl),
		"acks=all",
		"compression.type="+b.cfg.Compression,
		"batch.size="+strconv.Itoa(b.cfg.BatchSize),
		"linger.ms=20",
		"buffer.memory=268435456",
	)
	cmd := cl.Java(ctx, harness.ProducerPerformance, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return perfResult{}, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return perfResult{}, err
	}
	if err := cmd.Start(); err != nil {
		return perfResult{}, fmt.Errorf("starting ProducerPerformance: %w", err)
	}
	var (
		wg     sync.WaitGroup
		result perfResult
		found  bool
	)
	wg.Go(func() {
		echoLines(stdout, b.out, "    ", func(line string) {
			if r, ok := parseSummary(line); ok {
				result, found = r, true
			}
		})
	})
	wg.Go(func() { echoLines(stderr, b.out, "    stderr: ", nil) })
	wg.Wait()
	waitErr := cmd.Wait()
	if ctx.Err() != nil {
		return perfResult{}, ctx.Err()
	}
	if waitErr != nil {
		return perfResult{}, fmt.Errorf("ProducerPerformance into %s failed: %v (its output is above)", topic, waitErr)
	}
	if !found {
		return perfResult{}, fmt.Errorf("ProducerPerformance into %s printed no final summary line (\"N records sent, ... ms 50th ...\"): see its output above", topic)
	}
	if result.Records != b.cfg.Records() {
		return perfResult{}, fmt.Errorf("ProducerPerformance into %s sent %d records, want %d: see its output above for send errors", topic, result.Records, b.cfg.Records())
	}
	if st := cmd.ProcessState; st != nil {
		result.CPUSeconds = (st.UserTime() + st.SystemTime()).Seconds()
	}
	return result, nil
}

// echoLines copies r to w line by line with a prefix and hands each line to
// seen (if not nil).
func echoLines(r io.Reader, w io.Writer, prefix string, seen func(string)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fmt.Fprintf(w, "%s%s\n", prefix, sc.Text())
		if seen != nil {
			seen(sc.Text())
		}
	}
	// Drain the rest so the tool never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}
