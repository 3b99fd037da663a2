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
		{Mirror: "east", Topic: "orders", Partition: 0, SourceOffset: 1200, DestinationOffset: 1200, Lag: 0, State: "MIRRORING", Owner: "kmirror-2"},
		{Mirror: "east", Topic: "orders", Partition: 1, SourceOffset: 50, DestinationOffset: 40, Lag: 10, State: "MIRRORING", Reason: "retrying: produce NOT_ENOUGH_REPLICAS"},
		{Mirror: "east", Topic: "orders", Partition: 11, SourceOffset: 98765, DestinationOffset: 98000, Lag: 765, State: "FAILED", Reason: "destination: NOT_ENOUGH_REPLICAS\tretrying in 4s"},
		{Mirror: "east", Topic: "payments", Partition: 2, SourceOffset: -1, DestinationOffset: -1, Lag: -1, State: "PENDING"},
		{Mirror: "east", Topic: "payments", Partition: 3, SourceOffset: 10, DestinationOffset: 12, Lag: 0, State: "DIVERGED", Reason: "foreign write at destination offset 10:\nrun kmirror describe"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `MIRROR  TOPIC     PARTITION  SOURCE-OFFSET  DESTINATION-OFFSET  LAG  OWNER      STATE      REASON
east    orders    0          1200           1200                0    kmirror-2  MIRRORING
east    orders    1          50             40                  10   -          MIRRORING  retrying: produce NOT_ENOUGH_REPLICAS
east    orders    11         98765          98000               765  -          FAILED     destination: NOT_ENOUGH_REPLICAS retrying in 4s
east    payments  2          -              -                   -    -          PENDING
east    payments  3          10             12                  0    -          DIVERGED   foreign write at destination offset 10: run kmirror describe
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
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
