package leader

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// A produce request that the network held past its sender's lease (a
// middlebox, a proxy) can still be appended once it is delivered, also
// after the partition STOPPED and its last mirrored position was
// recorded: the batch then lands in a topic that applications may write
// now that it failed over (issue 19). Where the destination runs an
// authorizer the stop fences kmirror's own principal first (stopfence.go)
// and the broker refuses it; where none runs, nothing in stock Kafka can
// refuse it (an idempotent producer's epoch moves only with a batch it
// appends), so the leader watches every partition for a while after its
// stop and names any batch of the partition's producer that lands after
// the recorded position: logged as an error, kept on the partition
// (describe's REASON) and counted (kmirror_partition_late_records).

// LogLateBatch is the leader's log line for a late batch found.
const LogLateBatch = "a late batch of kmirror's landed in a STOPPED partition after its recorded last mirrored position: " +
	"a member's produce request held by the network past its lease; these records are copies of source records " +
	"after the recorded position, written after the stop"

// lateBatchWatch is how long after a stop the leader watches a partition.
// A held request arrives on the connection it was sent on, and the broker
// closes a connection silent for connections.max.idle.ms (default 10
// minutes): after that it cannot be appended.
const lateBatchWatch = 11 * time.Minute

// lateBatchInterval is how often the leader looks; lateBatchRead bounds
// one read of one partition (bytes).
const (
	lateBatchInterval = 2 * time.Second
	lateBatchRead     = 4 << 20
)

// lateWatch is a STOPPED partition the leader watches for late batches.
type lateWatch struct {
	key raftstore.PartitionKey
	// from is the first destination offset that is not kmirror's
	// recorded (or unverified) copy.
	from int64
	pid  int64
}

// lateBatchLoop watches recently STOPPED partitions until ctx ends (this
// member stops leading). The read positions are this leader's own: a new
// leader reads again from each recorded position, and the state counts
// each batch once.
func (l *Leader) lateBatchLoop(ctx context.Context) {
	next := map[raftstore.PartitionKey]int64{}
	for ctx.Err() == nil {
		sleepCtx(ctx, lateBatchInterval)
		for _, w := range l.lateWatches(time.Now()) {
			from := max(next[w.key], w.from)
			end, err := l.scanLate(ctx, w, from)
			if err != nil {
				l.log.Debug("late batch watch: read failed; trying again", zap.Stringer("partition", w.key), zap.Error(err))
				continue
			}
			next[w.key] = end
		}
	}
}

// lateWatches lists the STOPPED partitions stopped within lateBatchWatch
// of now whose producer identity is known.
func (l *Leader) lateWatches(now time.Time) []lateWatch {
	var out []lateWatch
	l.store.Read(func(s *raftstore.State) {
		for _, t := range sortedTopics(s) {
			for i, p := range t.Partitions {
				if p.State != raftstore.StateStopped || p.StoppedAtMs == 0 || p.LastMirrored == nil || !p.Producer.Allocated ||
					now.Sub(time.UnixMilli(p.StoppedAtMs)) > lateBatchWatch {
					continue
				}
				from := max(p.LastMirrored.DestinationOffset, p.UnverifiedEnd, p.LateEnd)
				out = append(out, lateWatch{key: raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}, from: from, pid: p.Producer.ProducerID})
			}
		}
	})
	return out
}

// scanLate reads w's destination partition from offset from up to its high
// watermark (lateBatchRead bytes a read) and records every batch of w's
// producer; it returns where the next read starts.
func (l *Leader) scanLate(ctx context.Context, w lateWatch, from int64) (int64, error) {
	for ctx.Err() == nil {
		batches, hw, err := l.dest.ReadBatches(ctx, w.key.Topic, w.key.Partition, from, lateBatchRead)
		if err != nil {
			return from, err
		}
		for _, b := range batches {
			if b.LastOffset() < from {
				continue
			}
			if b.ProducerID() == w.pid && !b.IsControl() {
				lb := raftstore.LateBatch{FirstOffset: b.BaseOffset(), LastOffset: b.LastOffset(), ProducerID: b.ProducerID(),
					Epoch: b.ProducerEpoch(), BaseSequence: b.BaseSequence(), Records: b.RecordCount()}
				if err := l.store.Apply(ctx, raftstore.RecordLateBatch{Key: w.key, Batch: lb}); err != nil {
					return from, err
				}
				l.log.Error(LogLateBatch, zap.Stringer("partition", w.key), zap.Stringer("batch", lb))
			}
			from = b.LastOffset() + 1
		}
		if from >= hw || len(batches) == 0 {
			return from, nil
		}
	}
	return from, ctx.Err()
}
