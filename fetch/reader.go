package fetch

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// Sequential reads of one partition for walks (resume, confirm, settle):
// the reader, its log bounds and out-of-range answers.

// readerFetchBytes is a partition reader's first fetch size.
const readerFetchBytes = 4 << 20

// partitionReader fetches one partition sequentially from its leader, on a
// pooled connection.
type partitionReader struct {
	cl            *cluster
	topic         string
	partition     int32
	offset        int64
	readCommitted bool
	maxBytes      int32
	addr          string
	conn          *kwire.Conn
	broken        bool // an exchange failed: close the connection, do not pool it
	epoch         int32
}

func openPartitionReader(ctx context.Context, cl *cluster, topic string, partition int32, offset int64, committed bool) (*partitionReader, error) {
	r := &partitionReader{cl: cl, topic: topic, partition: partition, offset: offset, readCommitted: committed, maxBytes: readerFetchBytes}
	if err := r.connect(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *partitionReader) connect(ctx context.Context) error {
	_, addr, epoch, err := r.cl.leader(ctx, r.topic, r.partition, 0)
	if err != nil {
		return err
	}
	if r.conn, err = r.cl.borrow(ctx, addr); err != nil {
		return err
	}
	r.addr, r.epoch = addr, epoch
	return nil
}

// close gives the connection back to the pool, or closes it after a
// failed exchange.
func (r *partitionReader) close() {
	switch {
	case r.conn == nil:
	case r.broken:
		r.conn.Close()
	default:
		r.cl.giveBack(r.addr, r.conn)
	}
	r.conn = nil
}

// fetch reads at r.offset without waiting for new data.
func (r *partitionReader) fetch(ctx context.Context) (kwire.FetchedPartition, error) {
	ctx, cancel := exchangeCtx(ctx)
	defer cancel()
	res, err := r.conn.Fetch(ctx, &kwire.FetchRequest{
		MaxBytes: r.maxBytes, ReadCommitted: r.readCommitted,
		Partitions: []kwire.FetchPartition{{Topic: r.topic, Partition: r.partition, Offset: r.offset,
			LeaderEpoch: r.epoch, MaxBytes: r.maxBytes}},
	})
	if err != nil {
		r.broken = true
		return kwire.FetchedPartition{}, err
	}
	if len(res) != 1 {
		return kwire.FetchedPartition{}, fmt.Errorf("fetch %s/%d: malformed response", r.topic, r.partition)
	}
	r.cl.fetchedBytes.Add(int64(len(res[0].Records)))
	if res[0].Err != 0 {
		kerr := &kwire.Error{Code: res[0].Err, Topic: r.topic, Partition: r.partition, Op: "fetch from " + r.cl.name}
		if res[0].Err == kwire.CodeOffsetOutOfRange {
			// The fetch answer's log start offset is -1 with an error:
			// ask for the log's bounds.
			start, end, err := r.bounds(ctx)
			if err != nil {
				return kwire.FetchedPartition{}, fmt.Errorf("%w; reading the log's bounds: %v", kerr, err)
			}
			return kwire.FetchedPartition{}, &outOfRange{cluster: r.cl.name, topic: r.topic, partition: r.partition,
				offset: r.offset, logStart: start, logEnd: end}
		}
		return kwire.FetchedPartition{}, kerr
	}
	return res[0], nil
}

// outOfRange is a fetch at an offset outside the partition's log
// [logStart, logEnd) (logEnd: the high watermark).
type outOfRange struct {
	cluster          string
	topic            string
	partition        int32
	offset           int64
	logStart, logEnd int64
}

func (o *outOfRange) Error() string {
	return fmt.Sprintf("offset %d of %s/%d is outside the log on the %s (offsets %d..%d)",
		o.offset, o.topic, o.partition, o.cluster, o.logStart, o.logEnd-1)
}

// bounds asks the partition's leader for its log start offset and high
// watermark (ListOffsets, read_uncommitted).
func (r *partitionReader) bounds(ctx context.Context) (start, end int64, err error) {
	if start, err = r.listOffset(ctx, Earliest); err != nil {
		return 0, 0, err
	}
	end, err = r.listOffset(ctx, Latest)
	return start, end, err
}

func (r *partitionReader) listOffset(ctx context.Context, which int64) (int64, error) {
	ctx, cancel := exchangeCtx(ctx)
	defer cancel()
	return listOffset(ctx, r.conn, r.cl.name, r.topic, r.partition, r.epoch, which)
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
func (r *partitionReader) logEndOffset(ctx context.Context) (int64, error) {
	ctx, cancel := exchangeCtx(ctx)
	defer cancel()
	end, err := r.conn.EpochEndOffset(ctx, r.topic, r.partition, r.epoch, r.epoch)
	if err != nil {
		r.broken = true
		return 0, err
	}
	if end.LeaderEpoch != r.epoch || end.EndOffset < 0 {
		return 0, fmt.Errorf("%s/%d on %s: leader answered epoch %d end offset %d for its current epoch %d",
			r.topic, r.partition, r.cl.name, end.LeaderEpoch, end.EndOffset, r.epoch)
	}
	return end.EndOffset, nil
}

// next returns the destination batches at r.offset (advancing past them)
// and the high watermark.
func (r *partitionReader) next(ctx context.Context) ([]kwire.Batch, int64, error) {
	for {
		fp, err := r.fetch(ctx)
		if err != nil {
			return nil, 0, err
		}
		batches, need, err := kwire.SplitBatches(fp.Records)
		if err != nil {
			return nil, 0, err
		}
		var out []kwire.Batch
		for _, b := range batches {
			if b.LastOffset() >= r.offset {
				out = append(out, b)
			}
		}
		if len(out) == 0 && need > 0 {
			r.maxBytes = growFetch(r.maxBytes, need)
			continue
		}
		if len(out) > 0 {
			r.offset = out[len(out)-1].LastOffset() + 1
		}
		return out, fp.HighWatermark, nil
	}
}

// nextSettled returns the next batches at r.offset, or ended once the
// reader is at the high watermark and the leader holds nothing above it.
// Records above the high watermark are waited for until they are committed
// or truncated by a leader change (DESIGN.md): deciding earlier would let
// such a batch become visible later as a duplicate of what is sent next.
func (r *partitionReader) nextSettled(ctx context.Context) (batches []kwire.Batch, ended bool, err error) {
	for {
		batches, hw, err := r.next(ctx)
		if err != nil || len(batches) > 0 {
			return batches, false, err
		}
		if r.offset < hw {
			return nil, false, fmt.Errorf("%s/%d on the %s: no data readable at offset %d below high watermark %d", r.topic, r.partition, r.cl.name, r.offset, hw)
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
