package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// franz-go is the independent client of these tests: records are written
// and read back by a Kafka client nobody here wrote, so a bug in kmirror's
// own codec cannot hide behind the same bug in the checker.

func kgoClient(t testing.TB, cl *harness.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	opts = append([]kgo.Opt{kgo.SeedBrokers(strings.Split(cl.Bootstrap(), ",")...)}, opts...)
	c, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// endOffsets returns per partition the last stable offset (committed) or
// the high watermark.
func endOffsets(t testing.TB, c *kgo.Client, topic string, partitions int, committed bool) []int64 {
	t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if committed {
		req.IsolationLevel = 1
	}
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := 0; p < partitions; p++ {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	out := make([]int64, partitions)
	shards := c.RequestSharded(context.Background(), req)
	for _, sh := range shards {
		if sh.Err != nil {
			t.Fatalf("list offsets of %s: %v", topic, sh.Err)
		}
		for _, tt := range sh.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, p := range tt.Partitions {
				if p.ErrorCode != 0 {
					t.Fatalf("list offsets of %s/%d: error %d", topic, p.Partition, p.ErrorCode)
				}
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// readAll reads every record of a topic, per partition, with an
// independent consumer (read_committed when committed is true).
func readAll(t testing.TB, cl *harness.Cluster, topic string, partitions int, committed bool) [][]*kgo.Record {
	t.Helper()
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	start := map[int32]kgo.Offset{}
	for p := 0; p < partitions; p++ {
		start[int32(p)] = kgo.NewOffset().AtStart()
	}
	c := kgoClient(t, cl, kgo.FetchIsolationLevel(iso),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(16<<20), kgo.FetchMaxWait(200*time.Millisecond))
	ends := endOffsets(t, c, topic, partitions, committed)
	out := make([][]*kgo.Record, partitions)
	done := func() bool {
		for p := range out {
			if ends[p] > 0 && (len(out[p]) == 0 || out[p][len(out[p])-1].Offset < ends[p]-1) {
				return false
			}
		}
		return true
	}
	// A partition whose last offsets are control or aborted records never
	// shows a record at end-1: stop after quiet polls instead.
	quiet := 0
	deadline := time.Now().Add(3 * time.Minute)
	for !done() && quiet < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("reading %s did not finish within 3 minutes", topic)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := c.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachError(func(tp string, p int32, err error) {
			if err != context.DeadlineExceeded {
				t.Fatalf("read %s/%d: %v", tp, p, err)
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			out[r.Partition] = append(out[r.Partition], r)
			n++
		})
		if n == 0 {
			quiet++
		} else {
			quiet = 0
		}
	}
	return out
}

// requireSameRecords compares source and destination partition by
// partition, record by record: order, key, value (null kept apart from
// empty), headers and timestamp.
func requireSameRecords(t testing.TB, src, dst [][]*kgo.Record) {
	t.Helper()
	if len(src) != len(dst) {
		t.Fatalf("source has %d partitions, destination %d", len(src), len(dst))
	}
	total := 0
	for p := range src {
		s, d := src[p], dst[p]
		for i := 0; i < len(s) && i < len(d); i++ {
			if why := diffRecord(s[i], d[i]); why != "" {
				t.Fatalf("partition %d record %d: source offset %d vs destination offset %d: %s",
					p, i, s[i].Offset, d[i].Offset, why)
			}
		}
		if len(s) != len(d) {
			t.Fatalf("partition %d: source has %d records, destination %d", p, len(s), len(d))
		}
		for i := 1; i < len(d); i++ {
			if d[i].Offset <= d[i-1].Offset {
				t.Fatalf("partition %d: destination offsets not increasing at %d", p, i)
			}
		}
		total += len(s)
	}
	t.Logf("compared %d records record by record", total)
}

func diffRecord(a, b *kgo.Record) string {
	switch {
	case !a.Timestamp.Equal(b.Timestamp):
		return fmt.Sprintf("timestamp %v != %v", a.Timestamp, b.Timestamp)
	case !sameBytes(a.Key, b.Key):
		return fmt.Sprintf("key %q != %q", abbrev(a.Key), abbrev(b.Key))
	case !sameBytes(a.Value, b.Value):
		return fmt.Sprintf("value %q != %q", abbrev(a.Value), abbrev(b.Value))
	case len(a.Headers) != len(b.Headers):
		return fmt.Sprintf("%d headers != %d", len(a.Headers), len(b.Headers))
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !sameBytes(a.Headers[i].Value, b.Headers[i].Value) {
			return fmt.Sprintf("header %d: %q=%q != %q=%q", i, a.Headers[i].Key, a.Headers[i].Value, b.Headers[i].Key, b.Headers[i].Value)
		}
	}
	return ""
}

func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

func abbrev(b []byte) string {
	if b == nil {
		return "<null>"
	}
	if len(b) > 40 {
		return fmt.Sprintf("%s...(%d bytes)", b[:40], len(b))
	}
	return string(b)
}

// waitCaughtUp polls describe until every partition of the topics is
// MIRRORING with lag 0 against a source end offset at least the one the
// source cluster reports when the wait starts: describe's source offset is
// what kmirror saw at its last fetch, so lag 0 alone could be stale.
func waitCaughtUp(t testing.TB, m *member, mirror string, topics ...string) []api.PartitionStatus {
	t.Helper()
	ctx := context.Background()
	src := m.src
	if src == nil {
		src = env.src
	}
	srcEnds := map[string][]int64{}
	sc := kgoClient(t, src)
	for _, topic := range topics {
		rows, err := m.client.Describe(ctx, mirror, topic)
		if err != nil {
			t.Fatalf("describe %s: %v", topic, err)
		}
		srcEnds[topic] = endOffsets(t, sc, topic, len(rows), true)
	}
	deadline := time.Now().Add(4 * time.Minute)
	var last []api.PartitionStatus
	for time.Now().Before(deadline) {
		ok := true
		last = last[:0]
		for _, topic := range topics {
			rows, err := m.client.Describe(ctx, mirror, topic)
			if errors.Is(err, api.ErrNotLeader) {
				ok = false // a member of a group catching up after a leader change
				continue
			}
			if err != nil {
				t.Fatalf("describe %s: %v", topic, err)
			}
			last = append(last, rows...)
			for _, r := range rows {
				if r.State == "DIVERGED" {
					t.Fatalf("partition %s/%d DIVERGED: %s", r.Topic, r.Partition, r.Reason)
				}
				if r.State != "MIRRORING" || r.Lag != 0 || r.SourceOffset < srcEnds[topic][r.Partition] {
					ok = false
				}
			}
		}
		if ok {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
	var behind []api.PartitionStatus
	for _, r := range last {
		if r.State != "MIRRORING" || r.Lag != 0 || r.SourceOffset < srcEnds[r.Topic][r.Partition] {
			behind = append(behind, r)
		}
	}
	t.Fatalf("not caught up within 4 minutes: %d of %d partitions behind (source ends %v): %+v\nlog:\n%s", len(behind), len(last), srcEnds, behind, m.logTail())
	return nil
}
