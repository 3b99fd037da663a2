package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
)

const (
	pollInterval = 200 * time.Millisecond
	// stallTimeout ends a run whose destination stops growing; it bounds a
	// hang, not the run time.
	stallTimeout   = 2 * time.Minute
	progressPeriod = 5 * time.Second
)

// mirrorResult is kmirror's run over the backlog.
type mirrorResult struct {
	Records int64
	Elapsed time.Duration // from AddTopics until caught up
	// FirstRecord is from AddTopics until the destination first holds a
	// record of the topic; Elapsed-FirstRecord is the copy alone, as the
	// MirrorMaker 2 run is timed.
	FirstRecord time.Duration
	CPU         time.Duration // the daemon's user+system time over Elapsed
	PeakRSS     int64         // the daemon's VmHWM at the end, bytes
}

// MBPerSec is the payload rate in MiB/s, the unit of ProducerPerformance.
func (r mirrorResult) MBPerSec(recordSize int) float64 {
	return float64(r.Records*int64(recordSize)) / mib / r.Elapsed.Seconds()
}

// CopyMBPerSec is the payload rate from the first record at the
// destination to the last, in MiB/s.
func (r mirrorResult) CopyMBPerSec(recordSize int) float64 {
	return float64(r.Records*int64(recordSize)) / mib / (r.Elapsed - r.FirstRecord).Seconds()
}

func (r mirrorResult) RecordsPerSec() float64 {
	return float64(r.Records) / r.Elapsed.Seconds()
}

// createMirror creates the bench's mirror of the source cluster.
func (b *bench) createMirror(ctx context.Context) error {
	err := b.group.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirrorName, Properties: b.mirrorProps()})
	if err != nil {
		return fmt.Errorf("create mirror: %w", err)
	}
	return nil
}

// mirrorBacklog adds a backlog topic to the mirror from the
// earliest offset and times kmirror until describe shows every partition
// MIRRORING with lag 0 and the destination holding every record.
func (b *bench) mirrorBacklog(ctx context.Context, topic string) (mirrorResult, error) {
	c := b.group.client
	want := b.cfg.Records()
	before, err := b.group.sample(b.ticks)
	if err != nil {
		return mirrorResult{}, err
	}
	start := time.Now()
	_, err = c.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirrorName, Topics: []string{topic}, StartFrom: "earliest"})
	if err != nil {
		return mirrorResult{}, fmt.Errorf("add topic %s: %w", topic, err)
	}
	b.printf("added topic %s (start from earliest); polling describe every %s", topic, pollInterval)

	w := newWatcher(b, topic)
	nextReport := start.Add(progressPeriod)
	dst, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.dst.Bootstrap(), ",")...))
	if err != nil {
		return mirrorResult{}, err
	}
	defer dst.Close()
	var first time.Duration
	for {
		if first == 0 {
			n, err := destinationRecords(ctx, dst, topic, b.cfg.Partitions)
			if err != nil {
				return mirrorResult{}, err
			}
			if n > 0 {
				first = time.Since(start)
			}
		}
		rows, err := w.poll(ctx)
		if err != nil {
			return mirrorResult{}, err
		}
		if rows == nil { // describe failed for now: poll again
			if err := w.sleep(ctx); err != nil {
				return mirrorResult{}, err
			}
			continue
		}
		sum, caughtUp := progress(rows, b.cfg.Partitions)
		now := time.Now()
		if caughtUp && sum == want {
			elapsed := now.Sub(start)
			after, err := b.group.sample(b.ticks)
			if err != nil {
				return mirrorResult{}, err
			}
			if err := b.checkDestination(ctx, topic, want); err != nil {
				return mirrorResult{}, err
			}
			if first == 0 {
				first = elapsed // between two polls
			}
			return mirrorResult{Records: want, Elapsed: elapsed, FirstRecord: first, CPU: after.CPU - before.CPU, PeakRSS: after.PeakRSS}, nil
		}
		if sum > want {
			return mirrorResult{}, fmt.Errorf("describe shows %d records at the destination, more than the %d of the source: %s", sum, want, formatRows(rows))
		}
		if now.After(nextReport) {
			nextReport = now.Add(progressPeriod)
			b.printf("  mirrored %d of %d records (%.0f%%), %.2f MB/s so far; states %s",
				sum, want, 100*float64(sum)/float64(want),
				float64(sum*int64(b.cfg.RecordSize))/mib/now.Sub(start).Seconds(), stateCounts(rows))
		}
		if err := w.sleep(ctx); err != nil {
			return mirrorResult{}, err
		}
	}
}

// watcher polls describe for one topic, fails on DIVERGED, on a daemon
// exit and on a destination that stops growing, and prints each new FAILED
// reason once.
type watcher struct {
	b            *bench
	topic        string
	failed       map[string]bool
	lastSum      int64
	lastProgress time.Time
	errorsSince  time.Time // first of consecutive describe errors, zero if none
}

func newWatcher(b *bench, topic string) *watcher {
	return &watcher{b: b, topic: topic, failed: map[string]bool{}, lastSum: -1, lastProgress: time.Now()}
}

// poll returns the topic's rows, or nil rows and no error while describe
// fails for less than 30s.
func (w *watcher) poll(ctx context.Context) ([]api.PartitionStatus, error) {
	if err := w.b.group.exited(); err != nil {
		return nil, err
	}
	rows, err := w.b.group.client.Describe(ctx, mirrorName, w.topic)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if w.errorsSince.IsZero() {
			w.errorsSince = time.Now()
		}
		if time.Since(w.errorsSince) > 30*time.Second {
			return nil, fmt.Errorf("describe %s has failed for 30s: %w", w.topic, err)
		}
		return nil, nil
	}
	w.errorsSince = time.Time{}
	for _, r := range rows {
		switch r.State {
		case "DIVERGED":
			return nil, fmt.Errorf("partition %s/%d DIVERGED: %s", r.Topic, r.Partition, r.Reason)
		case "FAILED":
			if !w.failed[r.Reason] {
				w.failed[r.Reason] = true
				w.b.printf("  NOTE: partition %s/%d is FAILED (kmirror retries): %s", r.Topic, r.Partition, r.Reason)
			}
		}
	}
	sum, _ := progress(rows, 0)
	if sum > w.lastSum {
		w.lastSum, w.lastProgress = sum, time.Now()
	} else if time.Since(w.lastProgress) > stallTimeout {
		return nil, fmt.Errorf("no progress on %s for %s: %s", w.topic, stallTimeout, formatRows(rows))
	}
	return rows, nil
}

func (w *watcher) sleep(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(pollInterval):
		return nil
	}
}

// progress sums the destination offsets of rows and says whether all
// partitions (if partitions > 0, exactly that many) are MIRRORING, live
// and at lag 0.
func progress(rows []api.PartitionStatus, partitions int) (sum int64, caughtUp bool) {
	caughtUp = len(rows) > 0 && (partitions == 0 || len(rows) == partitions)
	for _, r := range rows {
		if r.DestinationOffset > 0 {
			sum += r.DestinationOffset
		}
		if r.State != "MIRRORING" || r.Lag != 0 || r.SourceOffset < 0 {
			caughtUp = false
		}
	}
	return sum, caughtUp
}

func stateCounts(rows []api.PartitionStatus) string {
	counts := map[string]int{}
	for _, r := range rows {
		counts[r.State]++
	}
	var parts []string
	for s, n := range counts {
		parts = append(parts, fmt.Sprintf("%s×%d", s, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func formatRows(rows []api.PartitionStatus) string {
	var parts []string
	for _, r := range rows {
		p := fmt.Sprintf("%s/%d %s src=%d dst=%d lag=%d", r.Topic, r.Partition, r.State, r.SourceOffset, r.DestinationOffset, r.Lag)
		if r.Reason != "" {
			p += " (" + r.Reason + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// checkDestination asks the destination broker itself (not kmirror) for
// the end offsets of the mirrored topic and compares their sum with the
// source record count.
func (b *bench) checkDestination(ctx context.Context, topic string, want int64) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(b.dst.Bootstrap(), ",")...))
	if err != nil {
		return err
	}
	defer cl.Close()
	ends, err := endOffsets(ctx, cl, topic, b.cfg.Partitions)
	if err != nil {
		return err
	}
	var sum int64
	for _, e := range ends {
		sum += e
	}
	if sum != want {
		return fmt.Errorf("describe says caught up, but the destination broker reports %d records in %s (end offsets %v), want %d", sum, topic, ends, want)
	}
	b.printf("destination broker confirms %d records in %s (ListOffsets)", sum, topic)
	return nil
}

// endOffsets lists the high watermark of each partition of topic.
func endOffsets(ctx context.Context, cl *kgo.Client, topic string, partitions int) ([]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = -1 // latest
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	out := make([]int64, partitions)
	seen := 0
	for _, sh := range cl.RequestSharded(ctx, req) {
		if sh.Err != nil {
			return nil, fmt.Errorf("list offsets of %s: %w", topic, sh.Err)
		}
		for _, t := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return nil, fmt.Errorf("list offsets of %s/%d: %w", topic, p.Partition, err)
				}
				if int(p.Partition) < partitions {
					out[p.Partition] = p.Offset
					seen++
				}
			}
		}
	}
	if seen != partitions {
		return nil, errors.New("list offsets of " + topic + ": the broker did not answer for every partition")
	}
	return out, nil
}
