package fetch

import (
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Rates are taken over the last minute (issue 22: "the rate over the last
// minute") in buckets of rateBucket: the window is the rateBuckets-1
// full buckets before the current one and the current one's part.
const (
	rateBucket  = 5 * time.Second
	rateBuckets = 12
)

// progress is what a partition mirrored while this member holds it: the
// records and batch bytes acknowledged by the destination, and the same
// counts per rateBucket of the last minute. The engine's lock guards it.
type progress struct {
	since   time.Time // when this member took the partition
	records int64
	bytes   int64
	buckets [rateBuckets]rateCount
}

// rateCount is one bucket's counts; slot is its start (Unix time divided
// by rateBucket), which tells a stale bucket from the current one.
type rateCount struct {
	slot           int64
	records, bytes int64
}

func newProgress(now time.Time) progress { return progress{since: now} }

// mirrored counts a batch of records and bytes (the batch's size on the
// wire) acknowledged at now.
func (g *progress) mirrored(now time.Time, records, bytes int64) {
	g.records += records
	g.bytes += bytes
	slot := now.UnixNano() / int64(rateBucket)
	b := &g.buckets[slot%rateBuckets]
	if b.slot != slot {
		*b = rateCount{slot: slot}
	}
	b.records += records
	b.bytes += bytes
}

// rates returns the records and bytes mirrored per second over the last
// minute (over the time since the partition was taken, when shorter).
func (g *progress) rates(now time.Time) (recordsPerSec, bytesPerSec float64) {
	slot := now.UnixNano() / int64(rateBucket)
	var records, bytes int64
	for _, b := range g.buckets {
		if b.slot > slot-rateBuckets && b.slot <= slot {
			records += b.records
			bytes += b.bytes
		}
	}
	from := time.Unix(0, (slot-rateBuckets+1)*int64(rateBucket))
	if g.since.After(from) {
		from = g.since
	}
	window := now.Sub(from).Seconds()
	if window < 1 {
		window = 1 // a partition just taken: no rate from a sliver of time
	}
	return float64(records) / window, float64(bytes) / window
}

// timeLagMs is the partition's replication latency, in ms: how long the
// oldest source record the destination does not hold yet has been on the
// source (now minus its timestamp), 0 when caught up (lag 0), -1 when not
// known: the source's end not known yet (lag -1), or that record not
// fetched yet (head nil; the newest mirrored record's timestamp would
// overstate it after an idle spell). A timestamp in the future counts as
// 0.
func timeLagMs(now time.Time, lag int64, head kwire.Batch) int64 {
	switch {
	case lag < 0:
		return -1
	case lag == 0:
		return 0
	case head == nil:
		return -1
	}
	ts := head.FirstTimestamp()
	if head.IsLogAppendTime() {
		ts = head.MaxTimestamp() // the broker's append time: the records' own are not used
	}
	return max(0, now.UnixMilli()-ts)
}
