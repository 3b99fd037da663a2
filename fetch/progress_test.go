package fetch

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestProgressRates: the rates are over the last minute (or since the
// partition was taken, when shorter), buckets older than a minute no
// longer count, and a partition idle for a minute has rate 0.
func TestProgressRates(t *testing.T) {
	start := time.Unix(1_000_000, 0) // a bucket boundary
	g := newProgress(start)
	if r, b := g.rates(start); r != 0 || b != 0 {
		t.Fatalf("rates before anything was mirrored: %v records/s, %v bytes/s", r, b)
	}
	// 100 records of 1,000 bytes every second for 10 s.
	for s := 1; s <= 10; s++ {
		g.mirrored(start.Add(time.Duration(s)*time.Second), 100, 100_000)
	}
	if r, b := g.rates(start.Add(10 * time.Second)); r != 100 || b != 100_000 {
		t.Fatalf("after 10 s at 100 records/s: %v records/s, %v bytes/s", r, b)
	}
	if g.records != 1000 || g.bytes != 1_000_000 {
		t.Fatalf("counted %d records, %d bytes; want 1000, 1000000", g.records, g.bytes)
	}
	// 100 s on, at 10 records/s for the last 30 s: only those count.
	for s := 81; s <= 110; s++ {
		g.mirrored(start.Add(time.Duration(s)*time.Second), 10, 1000)
	}
	r, _ := g.rates(start.Add(110 * time.Second))
	if want := 300.0 / 55; math.Abs(r-want) > 1e-9 { // 55 s: 11 full buckets and the current one's start
		t.Fatalf("rate over the last minute: %v records/s, want %v", r, want)
	}
	// Idle for a minute and more.
	if r, b := g.rates(start.Add(200 * time.Second)); r != 0 || b != 0 {
		t.Fatalf("rates after a minute idle: %v records/s, %v bytes/s", r, b)
	}
}

// TestTimeLag: 0 caught up, -1 with the source's end not known or the
// first unmirrored record not fetched yet; behind, now minus that record's
// timestamp (the queue head's first timestamp, its max for a LogAppendTime
// batch); never negative.
func TestTimeLag(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	head, err := kwire.EncodeBatch([]kwire.Record{{Timestamp: 990_000}, {Timestamp: 995_000}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	appended := append(kwire.Batch(nil), head...)
	binary.BigEndian.PutUint16(appended[21:], uint16(appended.Attributes()|0x08)) // LogAppendTime
	future, err := kwire.EncodeBatch([]kwire.Record{{Timestamp: 2_000_000}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		lag  int64
		head kwire.Batch
		want int64
	}{
		{"caught up", 0, nil, 0},
		{"source end not known", -1, head, -1},
		{"behind, head fetched", 5, head, 10_000},
		{"behind, LogAppendTime head", 5, appended, 5_000},
		{"behind, nothing fetched", 5, nil, -1},
		{"timestamp in the future", 5, future, 0},
	} {
		if got := timeLagMs(now, tt.lag, tt.head); got != tt.want {
			t.Errorf("%s: time lag %d ms, want %d", tt.name, got, tt.want)
		}
	}
}
