package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ReadBatches reads a partition from offset from: the record batches of
// one fetch response (at most maxBytes bytes, read uncommitted) and the
// partition's high watermark. Batches may start before from (the broker
// returns whole batches). Errors wrap kwire.Error for a broker's refusal
// (the metadata is then refreshed on the next call) or the connection's.
func (a *Admin) ReadBatches(ctx context.Context, topic string, partition int32, from int64, maxBytes int32) ([]kwire.Batch, int64, error) {
	_, addr, epoch, err := a.cl.Leader(ctx, topic, partition, 5*time.Second)
	if err != nil {
		return nil, 0, err
	}
	conn, err := a.cl.Borrow(ctx, addr)
	if err != nil {
		return nil, 0, err
	}
	fctx, cancel := ExchangeCtx(ctx)
	res, err := conn.Fetch(fctx, &kwire.FetchRequest{
		MaxBytes:   maxBytes,
		Partitions: []kwire.FetchPartition{{Topic: topic, Partition: partition, Offset: from, LeaderEpoch: epoch, MaxBytes: maxBytes}},
	})
	cancel()
	if err != nil {
		conn.Close()
		return nil, 0, err
	}
	a.cl.GiveBack(addr, conn)
	if len(res) != 1 {
		return nil, 0, fmt.Errorf("read %s/%d: malformed fetch response", topic, partition)
	}
	fp := res[0]
	if fp.Err != 0 {
		return nil, 0, &kwire.Error{Code: fp.Err, Topic: topic, Partition: partition, Op: "read batches"}
	}
	batches, _, err := kwire.SplitBatches(fp.Records)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s/%d: %w", topic, partition, err)
	}
	return batches, fp.HighWatermark, nil
}
