package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Sequential reads of one partition for walks (resume, confirm, settle):
// the reader, its log bounds and out-of-range answers.

// ReaderFetchBytes is a partition reader's first fetch size.
const ReaderFetchBytes = 4 << 20

// PartitionReader fetches one partition sequentially from its leader, on a
// pooled connection.
type PartitionReader struct {
	cl            *Cluster
	topic         string
	partition     int32
	Offset        int64
	readCommitted bool
	MaxBytes      int32
	addr          string
	conn          *kwire.Conn
	broken        bool // an exchange failed: close the connection, do not pool it
	epoch         int32
}

func OpenPartitionReader(ctx context.Context, cl *Cluster, topic string, partition int32, offset int64, committed bool) (*PartitionReader, error) {
	r := &PartitionReader{cl: cl, topic: topic, partition: partition, Offset: offset, readCommitted: committed, MaxBytes: ReaderFetchBytes}
	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *PartitionReader) connect(ctx context.Context) error {
	_, addr, epoch, err := r.cl.Leader(ctx, r.topic, r.partition, 0)
	if err != nil {
		return err
	}
	if r.conn, err = r.cl.Borrow(ctx, addr); err != nil {
		return err
	}
	r.addr, r.epoch = addr, epoch
	return nil
}

// Close gives the connection back to the pool, or closes it after a
// failed exchange.
func (r *PartitionReader) Close() {
	switch {
	case r.conn == nil:
	case r.broken:
		r.conn.Close()
	default:
		r.cl.GiveBack(r.addr, r.conn)
	}
	r.conn = nil
}

// Fetch reads at r.Offset without waiting for new data.
func (r *PartitionReader) Fetch(ctx context.Context) (kwire.FetchedPartition, error) {
	ctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	res, err := r.conn.Fetch(ctx, &kwire.FetchRequest{
		MaxBytes: r.MaxBytes, ReadCommitted: r.readCommitted,
		Partitions: []kwire.FetchPartition{{Topic: r.topic, Partition: r.partition, Offset: r.Offset,
			LeaderEpoch: r.epoch, MaxBytes: r.MaxBytes}},
	})
	if err != nil {
		r.broken = true
		return kwire.FetchedPartition{}, err
	}
	if len(res) != 1 {
		return kwire.FetchedPartition{}, fmt.Errorf("fetch %s/%d: malformed response", r.topic, r.partition)
	}
	r.cl.FetchedBytes.Add(int64(len(res[0].Records)))
	if res[0].Err != 0 {
		kerr := &kwire.Error{Code: res[0].Err, Topic: r.topic, Partition: r.partition, Op: "fetch from " + r.cl.Name}
		if res[0].Err == kwire.CodeOffsetOutOfRange {
			// The fetch answer's log start offset is -1 with an error:
			// ask for the log's bounds.
			start, end, err := r.bounds(ctx)
			if err != nil {
				return kwire.FetchedPartition{}, fmt.Errorf("%w; reading the log's bounds: %v", kerr, err)
			}
			return kwire.FetchedPartition{}, &OutOfRange{Cluster: r.cl.Name, topic: r.topic, partition: r.partition,
				Offset: r.Offset, LogStart: start, LogEnd: end}
		}
		return kwire.FetchedPartition{}, kerr
	}
	return res[0], nil
}

// OutOfRange is a fetch at an offset outside the partition's log
// [logStart, logEnd) (logEnd: the high watermark).
type OutOfRange struct {
	Cluster          string
	topic            string
	partition        int32
	Offset           int64
	LogStart, LogEnd int64
}

func (o *OutOfRange) Error() string {
	return fmt.Sprintf("offset %d of %s/%d is outside the log on the %s (offsets %d..%d)",
		o.Offset, o.topic, o.partition, o.Cluster, o.LogStart, o.LogEnd-1)
}

// bounds asks the partition's leader for its log start offset and high
// watermark (ListOffsets, read_uncommitted).
func (r *PartitionReader) bounds(ctx context.Context) (start, end int64, err error) {
	if start, err = r.listOffset(ctx, Earliest); err != nil {
		return 0, 0, err
	}
	end, err = r.listOffset(ctx, Latest)
	return start, end, err
}

func (r *PartitionReader) listOffset(ctx context.Context, which int64) (int64, error) {
	ctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	return listOffset(ctx, r.conn, r.cl.Name, r.topic, r.partition, r.epoch, which)
}

// listOffset asks the leader on conn for a partition's earliest or latest
// (high watermark) offset.
func listOffset(ctx context.Context, conn *kwire.Conn, cluster, topic string, partition, epoch int32, which int64) (int64, error) {
	msg, err := conn.RoundTrip(ctx, &listoffsets.Request{ReplicaID: -1,
		Topics: []listoffsets.RequestTopic{{Topic: topic, Partitions: []listoffsets.RequestPartition{{
			Partition: partition, CurrentLeaderEpoch: epoch, Timestamp: which}}}}})
	if err != nil {
		return 0, err
	}
	for _, t := range msg.(*listoffsets.Response).Topics {
		for _, rp := range t.Partitions {
			if t.Topic == topic && rp.Partition == partition {
				if rp.ErrorCode != 0 {
					return 0, &kwire.Error{Code: rp.ErrorCode, Topic: topic, Partition: partition, Op: "list offsets on " + cluster}
				}
				return rp.Offset, nil
			}
		}
	}
	return 0, fmt.Errorf("list offsets of %s/%d on %s: no answer for the partition", topic, partition, cluster)
}

// logEndOffset asks the partition's leader for its log end offset: the end
// of its current leader epoch (see kwire.Conn.EpochEndOffset). A leader
// change since the reader connected is an error (FENCED_LEADER_EPOCH).
func (r *PartitionReader) logEndOffset(ctx context.Context) (int64, error) {
	ctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	end, err := r.conn.EpochEndOffset(ctx, r.topic, r.partition, r.epoch, r.epoch)
	if err != nil {
		r.broken = true
		return 0, err
	}
	if end.LeaderEpoch != r.epoch || end.EndOffset < 0 {
		return 0, fmt.Errorf("%s/%d on %s: leader answered epoch %d end offset %d for its current epoch %d",
			r.topic, r.partition, r.cl.Name, end.LeaderEpoch, end.EndOffset, r.epoch)
	}
	return end.EndOffset, nil
}

// next returns the destination batches at r.offset (advancing past them)
// and the high watermark.
func (r *PartitionReader) next(ctx context.Context) ([]kwire.Batch, int64, error) {
	for {
		fp, err := r.Fetch(ctx)
		if err != nil {
			return nil, 0, err
		}
		batches, need, err := kwire.SplitBatches(fp.Records)
		if err != nil {
			return nil, 0, err
		}
		var out []kwire.Batch
		for _, b := range batches {
			if b.LastOffset() >= r.Offset {
				out = append(out, b)
			}
		}
		if len(out) == 0 && need > 0 {
			r.MaxBytes = GrowFetch(r.MaxBytes, need)
			continue
		}
		if len(out) > 0 {
			r.Offset = out[len(out)-1].LastOffset() + 1
		}
		return out, fp.HighWatermark, nil
	}
}

// NextSettled returns the next batches at r.Offset, or ended once the
// reader is at the high watermark and the leader holds nothing above it.
// Records above the high watermark are waited for until they are committed
// or truncated by a leader change (DESIGN.md): deciding earlier would let
// such a batch become visible later as a duplicate of what is sent next.
func (r *PartitionReader) NextSettled(ctx context.Context) (batches []kwire.Batch, ended bool, err error) {
	for {
		batches, hw, err := r.next(ctx)
		if err != nil || len(batches) > 0 {
			return batches, false, err
		}
		if r.Offset < hw {
			return nil, false, fmt.Errorf("%s/%d on the %s: no data readable at offset %d below high watermark %d", r.topic, r.partition, r.cl.Name, r.Offset, hw)
		}
		leo, err := r.logEndOffset(ctx)
		if err != nil {
			return nil, false, err
		}
		if leo <= hw {
			return nil, true, nil
		}
		sleepCtx(ctx, uncommittedPoll)
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
	}
}

// uncommittedPoll is how often a walk re-reads a destination partition
// whose leader holds records above the high watermark.
const uncommittedPoll = 100 * time.Millisecond

// GrowFetch is the next fetch size after a record set ended in a partial
// batch of need bytes: at least need, at least double, at most 256 MiB.
func GrowFetch(cur int32, need int) int32 {
	return int32(min(max(int64(need), 2*int64(cur)), 256<<20))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
