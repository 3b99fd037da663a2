package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSummary(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		ok   bool
		want perfResult
	}{
		{
			name: "final line",
			line: "65536 records sent, 41025.6 records/sec (40.06 MB/sec), 312.45 ms avg latency, 901.00 ms max latency, 290 ms 50th, 650 ms 95th, 820 ms 99th, 890 ms 99.9th.",
			ok:   true,
			want: perfResult{Records: 65536, RecordsPerSec: 41025.6, MBPerSec: 40.06},
		},
		{
			name: "progress line has no percentiles",
			line: "204801 records sent, 40960.2 records/sec (40.00 MB/sec), 300.1 ms avg latency, 700.0 ms max latency.",
		},
		{name: "warning", line: "[12:00:00.000] WARN something (Producer)"},
		{name: "empty", line: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseSummary(tc.line)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if ok && (got.Records != tc.want.Records || got.RecordsPerSec != tc.want.RecordsPerSec || got.MBPerSec != tc.want.MBPerSec) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "1GiB", want: 1 << 30},
		{in: "64MiB", want: 64 << 20},
		{in: "5MB", want: 5_000_000},
		{in: "2KB", want: 2000},
		{in: "1024", want: 1024},
		{in: " 7 B ", want: 7},
		{in: "1.5GiB", bad: true},
		{in: "-1MiB", bad: true},
		{in: "MiB", bad: true},
		{in: "5mb", bad: true},
		{in: "99999999999GiB", bad: true},
	} {
		got, err := parseSize(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("parseSize(%q) = %d, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{1 << 30: "1GiB", 5_000_000: "5MB", 64 << 20: "64MiB", 1000: "1KB", 7: "7B"} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (km (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 37 0 0 20 0 12 0 100 1000000 2000 18446744073709551615"
	got, err := parseStatCPU(stat)
	if err != nil || got != 287 {
		t.Fatalf("parseStatCPU = %d, %v; want 287", got, err)
	}
	if _, err := parseStatCPU("4242 (short) S 1 2"); err == nil {
		t.Fatal("parseStatCPU of a short line: want an error")
	}
}

func TestParseStatusHWM(t *testing.T) {
	got, err := parseStatusHWM("Name:\tkmirror\nVmPeak:\t 900000 kB\nVmHWM:\t  123456 kB\nVmRSS:\t 100000 kB\n")
	if err != nil || got != 123456<<10 {
		t.Fatalf("parseStatusHWM = %d, %v; want %d", got, err, 123456<<10)
	}
	if _, err := parseStatusHWM("Name:\tkmirror\n"); err == nil {
		t.Fatal("parseStatusHWM without VmHWM: want an error")
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 = %v, want 50ms", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v, want 99ms", p)
	}
	if p := percentile(d[:1], 0.99); p != time.Millisecond {
		t.Errorf("p99 of one = %v, want 1ms", p)
	}
}

func TestStartGroupReportsEarlyExit(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "fake-kmirror")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'config is wrong' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := startGroup(context.Background(), bin, dir, "127.0.0.1:9092", "", "", 3, false)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "config is wrong") {
		t.Fatalf("startGroup of a binary that exits at once: %v; want the exit status and the log tail", err)
	}
}

// TestValidateDestinationRTT: --destination-rtt out of range, or with a
// security mode the delay line cannot carry, is named in the error.
func TestValidateDestinationRTT(t *testing.T) {
	base := config{Bytes: 1 << 20, RecordSize: 1024, Partitions: 8, Members: 1, Security: securityPlaintext,
		Compression: "lz4", SkipLatency: true, IdleSeconds: 1, BatchSize: 262144, Kmirror: "/bin/true"}
	if err := base.Validate(); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	for _, tc := range []struct {
		name string
		with func(*config)
		want string
	}{
		{"negative", func(c *config) { c.DestinationRTT = -time.Millisecond }, "--destination-rtt -1ms: use 0"},
		{"too long", func(c *config) { c.DestinationRTT = 3 * time.Second }, "--destination-rtt 3s: use 0"},
		{"over TLS", func(c *config) { c.DestinationRTT = 5 * time.Millisecond; c.Security = "sasl_ssl" }, "--destination-rtt with --security sasl_ssl"},
	} {
		c := base
		tc.with(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	c := base
	c.DestinationRTT = 5 * time.Millisecond
	if err := c.Validate(); err != nil {
		t.Fatalf("--destination-rtt 5ms: %v", err)
	}
}
