package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// timeLag formats a time lag in ms ("-" not known): "0s", "850ms",
// "4.2s", "3m4s", "2d3h".
func timeLag(ms int64) string {
	switch {
	case ms < 0:
		return "-"
	case ms == 0:
		return "0s"
	case ms < 1000:
		return strconv.FormatInt(ms, 10) + "ms"
	}
	return seconds(float64(ms) / 1000)
}

// seconds formats a duration in seconds: "4.2s" below a minute, then to
// the second, then days and hours.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case s < 60:
		return strconv.FormatFloat(math.Round(s*10)/10, 'f', -1, 64) + "s"
	case d < 24*time.Hour:
		return d.Round(time.Second).String()
	}
	days := int64(d / (24 * time.Hour))
	return fmt.Sprintf("%dd%dh", days, int64((d-time.Duration(days)*24*time.Hour)/time.Hour))
}

// eta formats an ETA in seconds ("-" not known, "0s" caught up).
func eta(s int64) string {
	if s < 0 {
		return "-"
	}
	return seconds(float64(s))
}

// count formats a count with a k/M/G suffix past 10,000: "850",
// "12.3k", "1.05M".
func count(n float64) string {
	switch {
	case n < 10_000:
		return strconv.FormatFloat(math.Round(n), 'f', -1, 64)
	case n < 10_000_000:
		return strconv.FormatFloat(math.Round(n/100)/10, 'f', -1, 64) + "k"
	case n < 10_000_000_000:
		return strconv.FormatFloat(math.Round(n/10_000)/100, 'f', -1, 64) + "M"
	}
	return strconv.FormatFloat(math.Round(n/10_000_000)/100, 'f', -1, 64) + "G"
}

// byteSize formats bytes in binary units ("-" negative: not known).
func byteSize(n float64) string {
	if n < 0 {
		return "-"
	}
	const unit = 1024
	if n < unit {
		return strconv.FormatFloat(math.Round(n), 'f', -1, 64) + " B"
	}
	exp, v := 0, n/unit
	for v >= unit && exp < 4 {
		v /= unit
		exp++
	}
	return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) + " " + string("KMGTP"[exp]) + "iB"
}

// topicProgress sums a topic's catching-up partitions: the records and
// bytes left and the rates are sums; the ETA is the slowest partition's
// (the topic is caught up when its last partition is). A part that is
// not known makes the sum not known (-1).
type topicProgress struct {
	mirror, topic     string
	recordsLeft       int64
	bytesLeft         int64
	recordRate, bytes float64
	eta               int64
}

// behind reports whether a row is a MIRRORING partition behind its
// source (a FAILED or DIVERGED one does not catch up: describe --failed).
func behind(p api.PartitionStatus) bool {
	return p.Lag > 0 && p.State == string(raftstore.StateMirroring)
}

// catchingUp returns the per-topic sums of the topics with a partition
// behind, in the order they first appear.
func catchingUp(rows []api.PartitionStatus) []topicProgress {
	var out []topicProgress
	at := map[[2]string]int{}
	for _, p := range rows {
		if !behind(p) {
			continue
		}
		k := [2]string{p.Mirror, p.Topic}
		i, ok := at[k]
		if !ok {
			i, at[k] = len(out), len(out)
			out = append(out, topicProgress{mirror: p.Mirror, topic: p.Topic})
		}
		t := &out[i]
		t.recordsLeft += p.Lag
		t.recordRate += p.RecordsPerSec
		t.bytes += p.BytesPerSec
		if t.bytesLeft >= 0 {
			t.bytesLeft = sumKnown(t.bytesLeft, p.BytesLeft)
		}
		if t.eta >= 0 {
			t.eta = max(t.eta, p.EtaSeconds)
			if p.EtaSeconds < 0 {
				t.eta = -1
			}
		}
	}
	return out
}

func sumKnown(a, b int64) int64 {
	if a < 0 || b < 0 {
		return -1
	}
	return a + b
}

// writeCatchingUp prints, when some partition is behind its source, the
// progress of each such topic (PARTITION "all") and partition: records
// and bytes (estimated) left, the rates over the last minute and the ETA
// at that rate (issue 22: progress of the initial sync).
func writeCatchingUp(w io.Writer, rows []api.PartitionStatus) error {
	topics := catchingUp(rows)
	if len(topics) == 0 {
		return nil
	}
	table := [][]string{{"MIRROR", "TOPIC", "PARTITION", "RECORDS-LEFT", "BYTES-LEFT", "RECORDS/S", "BYTES/S", "ETA"}}
	for _, t := range topics {
		table = append(table, []string{t.mirror, t.topic, "all", strconv.FormatInt(t.recordsLeft, 10), byteSize(float64(t.bytesLeft)),
			count(t.recordRate), byteSize(t.bytes), eta(t.eta)})
		for _, p := range rows {
			if behind(p) && p.Mirror == t.mirror && p.Topic == t.topic {
				table = append(table, []string{"", "", strconv.Itoa(int(p.Partition)), strconv.FormatInt(p.Lag, 10), byteSize(float64(p.BytesLeft)),
					count(p.RecordsPerSec), byteSize(p.BytesPerSec), eta(p.EtaSeconds)})
			}
		}
	}
	if _, err := fmt.Fprintln(w, "\nCATCHING UP (rates over the last minute; bytes left estimated from the bytes per record mirrored)"); err != nil {
		return err
	}
	return writeTable(w, table)
}
