package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

func TestWriteMirrorTable(t *testing.T) {
	var out strings.Builder
	err := writeMirrorTable(&out, []api.MirrorSummary{
		{Name: "east", Topics: []string{"orders", "payments"}, Bootstrap: []string{"a1:9092", "a2:9092"}, State: "MIRRORING",
			Include: []string{"orders.*", "pay.*"}, Exclude: []string{".*-tmp"}, Skipped: map[string]string{"orders-x": "mirrored by mirror b"}},
		{Name: "west-backup", Bootstrap: []string{"w1:9092"}, State: "FAILED"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `MIRROR       TOPICS           SOURCE-BOOTSTRAP  STATE      PATTERNS
east         orders,payments  a1:9092,a2:9092   MIRRORING  --include orders.* --include pay.* --exclude .*-tmp (1 matches skipped: see describe)
west-backup  -                w1:9092           FAILED     -
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

func TestWriteMirrorTableEmpty(t *testing.T) {
	var out strings.Builder
	if err := writeMirrorTable(&out, nil); err != nil {
		t.Fatal(err)
	}
	if want := "MIRROR  TOPICS  SOURCE-BOOTSTRAP  STATE  PATTERNS\n"; out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestWritePartitionTable(t *testing.T) {
	var out strings.Builder
	err := writePartitionTable(&out, []api.PartitionStatus{
		{Mirror: "east", Topic: "orders", Partition: 0, SourceOffset: 1200, DestinationOffset: 1200, Lag: 0, State: "MIRRORING", Owner: "kmirror-2",
			RecordsPerSec: 12.4},
		{Mirror: "east", Topic: "orders", Partition: 1, SourceOffset: 50, DestinationOffset: 40, Lag: 10, TimeLagMs: 850, State: "MIRRORING",
			Reason: "retrying: produce NOT_ENOUGH_REPLICAS", BytesLeft: -1, EtaSeconds: -1},
		{Mirror: "east", Topic: "orders", Partition: 11, SourceOffset: 98765, DestinationOffset: 98000, Lag: 765, TimeLagMs: 3_725_000, State: "FAILED",
			Reason: "destination: NOT_ENOUGH_REPLICAS\tretrying in 4s", BytesLeft: -1, EtaSeconds: -1},
		{Mirror: "east", Topic: "payments", Partition: 2, SourceOffset: -1, DestinationOffset: -1, Lag: -1, TimeLagMs: -1, State: "PENDING"},
		{Mirror: "east", Topic: "payments", Partition: 3, SourceOffset: 10, DestinationOffset: 12, Lag: 0, State: "DIVERGED", Reason: "foreign write at destination offset 10:\nrun kmirror describe"},
		{Mirror: "east", Topic: "payments", Partition: 4, SourceOffset: 2_000_000, DestinationOffset: 800_000, Lag: 1_200_000, TimeLagMs: 93_600_000,
			RecordsPerSec: 52_345, BytesPerSec: 40 << 20, BytesLeft: 900 << 20, EtaSeconds: 23, State: "MIRRORING"},
		{Mirror: "east", Topic: "payments", Partition: 5, SourceOffset: 1_000_000, DestinationOffset: 0, Lag: 1_000_000, TimeLagMs: 93_600_000,
			RecordsPerSec: 40_000, BytesPerSec: 30 << 20, BytesLeft: 750 << 20, EtaSeconds: 25, State: "MIRRORING"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `MIRROR  TOPIC     PARTITION  SOURCE-OFFSET  DESTINATION-OFFSET  LAG      TIME-LAG  RECORDS/S  OWNER      STATE      REASON
east    orders    0          1200           1200                0        0s        12         kmirror-2  MIRRORING
east    orders    1          50             40                  10       850ms     0          -          MIRRORING  retrying: produce NOT_ENOUGH_REPLICAS
east    orders    11         98765          98000               765      1h2m5s    0          -          FAILED     destination: NOT_ENOUGH_REPLICAS retrying in 4s
east    payments  2          -              -                   -        -         -          -          PENDING
east    payments  3          10             12                  0        0s        0          -          DIVERGED   foreign write at destination offset 10: run kmirror describe
east    payments  4          2000000        800000              1200000  1d2h      52.3k      -          MIRRORING
east    payments  5          1000000        0                   1000000  1d2h      40k        -          MIRRORING

CATCHING UP (rates over the last minute; bytes left estimated from the bytes per record mirrored)
MIRROR  TOPIC     PARTITION  RECORDS-LEFT  BYTES-LEFT  RECORDS/S  BYTES/S  ETA
east    orders    all        10            -           0          0 B      -
                  1          10            -           0          0 B      -
east    payments  all        2200000       1.6 GiB     92.3k      70 MiB   25s
                  4          1200000       900 MiB     52.3k      40 MiB   23s
                  5          1000000       750 MiB     40k        30 MiB   25s
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestFormatProgress: the time lag, rate and size cells.
func TestFormatProgress(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{timeLag(-1), "-"}, {timeLag(0), "0s"}, {timeLag(999), "999ms"}, {timeLag(4249), "4.2s"}, {timeLag(61_400), "1m1s"},
		{timeLag(3 * 86_400_000), "3d0h"}, {eta(-1), "-"}, {eta(0), "0s"}, {eta(3600), "1h0m0s"},
		{count(0), "0"}, {count(9999.4), "9999"}, {count(12_345), "12.3k"}, {count(10_500_000), "10.5M"}, {count(3e10), "30G"},
		{byteSize(-1), "-"}, {byteSize(1023), "1023 B"}, {byteSize(1536), "1.5 KiB"}, {byteSize(5 << 30), "5 GiB"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestWriteJSON(t *testing.T) {
	var out strings.Builder
	if err := writeJSON(&out, result{Result: "created", Mirror: "east"}); err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"result\": \"created\",\n  \"mirror\": \"east\"\n}\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

// TestWriteFailedTable: describe --failed keeps the partitions that are
// not MIRRORING and shows since when (UTC, and how long ago) and how
// often each failed.
func TestWriteFailedTable(t *testing.T) {
	now := time.Date(2026, 12, 5, 15, 0, 0, 0, time.UTC)
	rows := notMirroring([]api.PartitionStatus{
		{Mirror: "east", Topic: "orders", Partition: 0, State: "MIRRORING"},
		{Mirror: "east", Topic: "orders", Partition: 1, State: "DIVERGED", Reason: "foreign write", Owner: "m2",
			StateSinceMs: now.Add(-90 * time.Second).UnixMilli(), Failures: 2},
		{Mirror: "east", Topic: "pay", Partition: -1, State: "SKIPPED", Reason: "mirrored by mirror b"},
	})
	var out strings.Builder
	if err := writeFailedTable(&out, rows, now); err != nil {
		t.Fatal(err)
	}
	want := `MIRROR  TOPIC   PARTITION  STATE     SINCE                             FAILURES  OWNER  REASON
east    orders  1          DIVERGED  2026-12-05 14:58:30Z (1m30s ago)  2         m2     foreign write
east    pay     -          SKIPPED   -                                 0         -      mirrored by mirror b
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestWriteMirrorHooks: list names each mirror's latest failover hook
// runs with their outcome.
func TestWriteMirrorHooks(t *testing.T) {
	var out strings.Builder
	err := writeMirrorTable(&out, []api.MirrorSummary{{Name: "east", Topics: []string{}, Bootstrap: []string{"a:9092"}, State: "EMPTY",
		FailoverHooks: []api.HookRunStatus{
			{ID: "east-40", Topics: []string{"orders"}, Kind: "remove", State: api.HookSucceeded, Attempts: 1, StoppedAtMs: 1_796_000_000_000},
			{ID: "east-42", Topics: []string{"a", "b"}, Kind: "automatic", State: api.HookRetrying, Attempts: 2, LastError: "HTTP 503: busy",
				Succeeded: []string{"exec"}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	want := `MIRROR  TOPICS  SOURCE-BOOTSTRAP  STATE  PATTERNS
east    -       a:9092            EMPTY  -
east: failover hook east-40 (remove of orders at 2026-11-30 00:53:20Z): succeeded after 1 attempts
east: failover hook east-42 (automatic of a, b at -): retrying after 2 attempts: HTTP 503: busy (failover.hook.exec succeeded)
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}
