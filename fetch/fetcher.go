package fetch

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// minFetchBudget is the least free memory budget worth a fetch.
const minFetchBudget = 256 << 10

// fetchLoop is the one fetch loop for a source broker: a single
// multi-partition read_committed Fetch covering every partition of the
// mirror that this broker leads and that has room in its queue.
func (e *Engine) fetchLoop(mirror string, src *source, w *worker) {
	var conn *kwire.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	backoff := e.cfg.RetryBackoff
	for e.ctx.Err() == nil {
		req, current := e.fetchRequest(mirror, src, w)
		if !current {
			return // replaced: the broker moved to another address
		}
		if req == nil {
			select {
			case <-e.ctx.Done():
				return
			case <-w.kick:
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		var err error
		if conn == nil {
			conn, err = src.cl.dial(e.ctx, w.addr)
		}
		var res []kwire.FetchedPartition
		if err == nil {
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.FetchMaxWait+30*time.Second)
			res, err = conn.Fetch(ctx, req)
			cancel()
		}
		if err != nil {
			if e.ctx.Err() != nil {
				return
			}
			e.log.Warn("fetch failed", zap.String("mirror", mirror), zap.String("broker", w.addr), zap.Error(err))
			if conn != nil {
				conn.Close()
				conn = nil
			}
			e.reroute(requestKeys(mirror, req), func(p *partition) *int32 { return &p.srcLeader })
			sleepCtx(e.ctx, backoff)
			backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
			continue
		}
		backoff = e.cfg.RetryBackoff
		e.handleFetch(mirror, w.broker, req, res)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func requestKeys(mirror string, req *kwire.FetchRequest) []Key {
	keys := make([]Key, len(req.Partitions))
	for i, fp := range req.Partitions {
		keys[i] = Key{mirror, fp.Topic, fp.Partition}
	}
	return keys
}

// reroute marks partitions of a failed request as needing a fresh leader.
func (e *Engine) reroute(keys []Key, leader func(*partition) *int32) {
	e.mu.Lock()
	for _, k := range keys {
		if p, ok := e.parts[k]; ok {
			*leader(p) = -1
		}
	}
	e.mu.Unlock()
	kick(e.kickRt)
}

// fetchRequest builds the next fetch for a broker, or nil when no partition
// wants data or the memory budget is spent.
func (e *Engine) fetchRequest(mirror string, src *source, w *worker) (*kwire.FetchRequest, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if src.fetchers[w.broker] != w || e.sources[mirror] != src {
		return nil, false
	}
	broker := w.broker
	free := e.cfg.MemoryBudget - e.inUse
	if free < minFetchBudget {
		return nil, true
	}
	limit := int64(e.cfg.PartitionBytes) * 2
	req := &kwire.FetchRequest{
		MaxWait:       e.cfg.FetchMaxWait,
		MinBytes:      1,
		MaxBytes:      int32(min(int64(e.cfg.FetchMaxBytes), free)),
		ReadCommitted: true,
	}
	for k, p := range e.parts {
		if k.Mirror != mirror || p.srcLeader != broker || !p.wantsFetch(limit) {
			continue
		}
		if p.fetchBytes == 0 {
			p.fetchBytes = e.cfg.PartitionBytes
		}
		req.Partitions = append(req.Partitions, kwire.FetchPartition{
			Topic: k.Topic, Partition: k.Partition, Offset: p.fetchOffset,
			LeaderEpoch: p.srcEpoch, MaxBytes: p.fetchBytes,
		})
	}
	if len(req.Partitions) == 0 {
		return nil, true
	}
	return req, true
}

// handleFetch turns a fetch response into produce-queue items.
func (e *Engine) handleFetch(mirror string, broker int32, req *kwire.FetchRequest, res []kwire.FetchedPartition) {
	asked := make(map[Key]int64, len(req.Partitions))
	for _, fp := range req.Partitions {
		asked[Key{mirror, fp.Topic, fp.Partition}] = fp.Offset
	}
	kicks := map[int32]bool{}
	for _, fp := range res {
		k := Key{mirror, fp.Topic, fp.Partition}
		from, ok := asked[k]
		if !ok {
			continue
		}
		e.mu.Lock()
		p := e.parts[k]
		current := p != nil && p.state == Mirroring && !p.draining && p.srcLeader == broker && p.fetchOffset == from
		if current {
			p.srcEnd = fp.LastStableOffset
			if fp.Err != 0 {
				e.fetchErrorLocked(p, fp)
				current = false
			}
		}
		e.mu.Unlock()
		if !current || len(fp.Records) == 0 {
			continue
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, from)
		e.mu.Lock()
		if p.state != Mirroring || p.draining || p.fetchOffset != from {
			e.mu.Unlock()
			continue
		}
		if err != nil {
			e.failLocked(p, fmt.Errorf("source data of %s at offset %d: %w", k, from, err))
			e.mu.Unlock()
			continue
		}
		if len(items) == 0 && need > 0 {
			// A batch larger than the partition fetch size: grow it.
			p.fetchBytes = int32(max(int64(need), 2*int64(p.fetchBytes)))
		}
		for _, it := range items {
			p.queue = append(p.queue, it)
			p.queued += it.size
			e.inUse += it.size
		}
		p.fetchOffset = next
		if len(items) > 0 && p.dstLeader >= 0 {
			kicks[p.dstLeader] = true
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	for id := range kicks {
		if w := e.senders[id]; w != nil {
			kick(w.kick)
		}
	}
	e.mu.Unlock()
}

// fetchErrorLocked handles a partition-level fetch error.
func (e *Engine) fetchErrorLocked(p *partition, fp kwire.FetchedPartition) {
	kerr := &kwire.Error{Code: fp.Err, Topic: fp.Topic, Partition: fp.Partition, Op: "fetch from source"}
	switch {
	case fp.Err == kwire.CodeOffsetOutOfRange:
		e.divergeLocked(p, fmt.Sprintf("source offset %d of %s is out of range (source log starts at %d): "+
			"records were deleted on the source before they were mirrored; remove and re-add the topic to start over",
			p.fetchOffset, p.key(), fp.LogStartOffset))
	case kerr.Action() == kwire.RefreshMetadata:
		p.srcLeader = -1
		kick(e.kickRt)
	case kerr.Action() == kwire.Retry:
	default:
		e.failLocked(p, kerr)
	}
}
