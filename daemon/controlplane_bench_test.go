package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/kmirror/kmirror/raftstore"
)

// memorySink is a raft.SnapshotSink in memory.
type memorySink struct{ bytes.Buffer }

func (*memorySink) ID() string    { return "bench" }
func (*memorySink) Cancel() error { return nil }
func (*memorySink) Close() error  { return nil }

// BenchmarkControlPlane100k runs the control plane at scale, in process
// and without Kafka: 100,000 partitions in 1,000 topics over a 3-member
// raft group (lease TTL 1 s). It reports the time from adding the topics
// to every partition leased and balanced, the snapshot size and restore
// time, and the time from killing the raft leader to every one of its
// partitions leased to a survivor (election, then the TTL, then the
// assignment). Targets (issue 6): snapshot < 10 MB, reassigned < 5 s.
// Run: go test ./daemon -run XXX -bench ControlPlane -benchtime 1x
func BenchmarkControlPlane100k(b *testing.B) {
	const topics, perTopic, ttl = 1000, 100, time.Second
	for i := 0; i < b.N; i++ {
		g := newGroup(b, 3, ttl)
		ctx := context.Background()
		l := g.leader()
		if err := l.store.Apply(ctx, raftstore.CreateMirror{Mirror: raftstore.Mirror{Name: "m", Bootstrap: []string{"src:9092"}}}); err != nil {
			b.Fatal(err)
		}
		for _, m := range g.members { // as each member's announce would
			if err := l.store.Apply(ctx, raftstore.UpsertMember{Member: raftstore.Member{ID: m.cfg.NodeID, Voter: true, Joined: true}}); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		for n := range topics {
			mt := raftstore.MirrorTopic{Mirror: "m", Topic: fmt.Sprintf("topic-%04d", n), State: raftstore.StateMirroring,
				Partitions: make([]raftstore.PartitionInfo, perTopic)}
			for p := range mt.Partitions {
				mt.Partitions[p] = raftstore.PartitionInfo{State: raftstore.StateMirroring,
					Producer: raftstore.ProducerIdentity{ProducerID: int64(n*perTopic + p), Allocated: true}}
			}
			if err := l.store.Apply(ctx, raftstore.AddTopic{Topic: mt}); err != nil {
				b.Fatal(err)
			}
		}
		added := time.Since(start)
		li := 0
		for j, m := range g.members {
			if m == l {
				li = j
			}
		}
		waitFor(b, time.Minute, "every partition leased and balanced", func() bool {
			return isBalanced(ownerCounts(g.partitions(li)), "n1", "n2", "n3")
		})
		assigned := time.Since(start)

		snap, err := l.store.FSM().Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		var sink memorySink
		if err := snap.Persist(&sink); err != nil {
			b.Fatal(err)
		}
		size := sink.Len()
		rstart := time.Now()
		if err := raftstore.NewFSM().Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
			b.Fatal(err)
		}
		restore := time.Since(rstart)

		dead := l.cfg.NodeID
		survivor := (li + 1) % 3
		kill := time.Now()
		g.stop(l)
		g.isolate(li)
		waitFor(b, time.Minute, "the dead leader's partitions leased to survivors", func() bool {
			return ownerCounts(g.partitions(survivor))[dead] == 0
		})
		reassigned := time.Since(kill)
		for _, m := range g.members {
			g.stop(m)
		}
		b.ReportMetric(assigned.Seconds(), "s-to-assign")
		b.ReportMetric(float64(size)/1e6, "MB-snapshot")
		b.ReportMetric(restore.Seconds(), "s-restore")
		b.ReportMetric(reassigned.Seconds(), "s-reassign")
		b.Logf("100,000 partitions in 1,000 topics, 3 members: topics added in %s, all leased and balanced %s after the first add; "+
			"snapshot %.2f MB, restored in %s; leader killed: its partitions leased to survivors after %s (lease TTL %s)",
			added.Round(time.Millisecond), assigned.Round(time.Millisecond), float64(size)/1e6, restore.Round(time.Millisecond),
			reassigned.Round(time.Millisecond), ttl)
	}
}
