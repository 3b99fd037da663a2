package fetch

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// maxProduceBytes bounds one produce request (brokers accept 100 MiB).
const maxProduceBytes = 32 << 20

// sent is one partition's batch in a produce request.
type sent struct {
	p  *partition
	it *item
}

// produceLoop is the produce loop for one destination broker: each request
// carries the head batch of every ready partition that broker leads, so
// each partition has at most one batch in flight and retries resend the
// same bytes with the same sequence numbers.
func (e *Engine) produceLoop(w *worker) {
	var conn *kwire.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	backoff := e.cfg.RetryBackoff
	for e.ctx.Err() == nil {
		batch, wait, current := e.collectProduce(w)
		if !current {
			return // replaced: the broker moved to another address
		}
		if len(batch) == 0 {
			select {
			case <-e.ctx.Done():
				return
			case <-w.kick:
			case <-time.After(wait):
			}
			continue
		}
		parts := make([]kwire.ProducePartition, len(batch))
		for i, s := range batch {
			k := s.p.key()
			parts[i] = kwire.ProducePartition{Topic: k.Topic, Partition: k.Partition, Batch: s.it.batch}
		}
		var err error
		if conn == nil {
			conn, err = e.dest.dial(e.ctx, w.addr)
		}
		var res []kwire.ProduceResult
		if err == nil {
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.ProduceTimeout+10*time.Second)
			res, err = conn.Produce(ctx, -1, e.cfg.ProduceTimeout, parts)
			cancel()
		}
		if err != nil {
			// The outcome is unknown: resend the same batches (same
			// sequences) once routed again; the broker de-duplicates.
			if conn != nil {
				conn.Close()
				conn = nil
			}
			if e.ctx.Err() != nil {
				return
			}
			e.log.Warn("produce failed", zap.String("broker", w.addr), zap.Error(err))
			e.unsend(batch, err)
			sleepCtx(e.ctx, backoff)
			backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
			continue
		}
		backoff = e.cfg.RetryBackoff
		e.handleProduce(batch, res)
	}
}

// collectProduce takes the head batch of every ready partition led by
// broker, assigning sequence numbers the first time a batch is sent. wait
// is how long to sleep when nothing is ready.
func (e *Engine) collectProduce(w *worker) (batch []sent, wait time.Duration, current bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.senders[w.broker] != w {
		return nil, 0, false
	}
	broker := w.broker
	wait = time.Second
	now := time.Now()
	size := 0
	for _, p := range e.parts {
		if p.dstLeader != broker || !p.active() || p.inflight {
			continue
		}
		for len(p.queue) > 0 && p.queue[0].skip() {
			p.skipped(p.queue[0])
			p.queue = p.queue[1:]
		}
		if len(p.queue) == 0 {
			if p.draining && p.released != nil {
				closeOnce(p)
			}
			continue
		}
		if now.Before(p.retryAt) {
			wait = min(wait, p.retryAt.Sub(now))
			continue
		}
		it := p.queue[0]
		if size > 0 && size+len(it.batch) > maxProduceBytes {
			wait = 0
			continue
		}
		if !it.seqSet {
			it.seq = p.nextSeq
			it.seqSet = true
			it.batch.Rewrite(p.producer.ID, p.producer.Epoch, it.seq)
		}
		p.inflight = true
		size += len(it.batch)
		batch = append(batch, sent{p, it})
	}
	return batch, wait, true
}

// unsend returns batches whose produce outcome is unknown (the request
// failed with err) to their queues, to be resent once routed again.
func (e *Engine) unsend(batch []sent, err error) {
	e.mu.Lock()
	for _, s := range batch {
		s.p.inflight = false
		s.p.dstLeader = -1
		s.p.produceErr = err.Error()
	}
	e.mu.Unlock()
	kick(e.kickRt)
}

// handleProduce applies a produce response.
func (e *Engine) handleProduce(batch []sent, res []kwire.ProduceResult) {
	byKey := make(map[Key]kwire.ProduceResult, len(res))
	for _, r := range res {
		byKey[Key{Topic: r.Topic, Partition: r.Partition}] = r
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range batch {
		p, it := s.p, s.it
		p.inflight = false
		k := p.key()
		r, ok := byKey[Key{Topic: k.Topic, Partition: k.Partition}]
		if !ok || len(p.queue) == 0 || p.queue[0] != it {
			// No answer for it, or it was dropped meanwhile (failed or
			// diverged): nothing to apply.
			continue
		}
		if r.Err != 0 {
			e.produceErrorLocked(p, r)
			continue
		}
		if r.BaseOffset != p.pos.DestinationOffset {
			e.divergeLocked(p, fmt.Sprintf("destination %s/%d: batch for source offsets %d..%d landed at offset %d, expected %d: "+
				"another producer has written to the destination partition (mirror topics must stay read-only until failover)",
				k.Topic, k.Partition, it.srcFirst, it.srcNext-1, r.BaseOffset, p.pos.DestinationOffset))
			continue
		}
		p.ack(it, r.BaseOffset)
		p.produceErr = ""
		p.queue = p.queue[1:]
		p.queued -= it.size
		e.inUse -= it.size
		p.failures = 0
		if p.draining && p.drained() {
			for len(p.queue) > 0 && p.queue[0].skip() {
				p.skipped(p.queue[0])
				p.queue = p.queue[1:]
			}
			if p.released != nil {
				closeOnce(p)
			}
		}
	}
	e.kickFetchersLocked()
}

// produceErrorLocked handles a partition-level produce error.
func (e *Engine) produceErrorLocked(p *partition, r kwire.ProduceResult) {
	kerr := &kwire.Error{Code: r.Err, Topic: r.Topic, Partition: r.Partition, Op: "produce to destination"}
	msg := kerr.Error()
	if r.Message != "" {
		msg += " (" + r.Message + ")"
	}
	switch {
	case r.Err == kwire.CodeOutOfOrderSequence || r.Err == kwire.CodeUnknownProducerID:
		// The broker lost our producer state (the producer ID expired after
		// an idle period, or its batches were deleted by retention). Resume
		// with a fresh identity: the walk re-verifies the destination.
		e.log.Warn("destination lost producer state; renewing the producer identity",
			zap.Stringer("partition", p.key()), zap.String("error", msg))
		p.spec.Producer = nil
		e.failLocked(p, fmt.Errorf("%s; renewing the producer identity", msg))
	case kerr.Action() == kwire.RefreshMetadata:
		p.dstLeader = -1
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		p.produceErr = msg
		kick(e.kickRt)
	case kerr.Action() == kwire.Retry:
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		p.produceErr = msg
	default:
		e.failLocked(p, fmt.Errorf("%s", msg))
	}
}

func (e *Engine) kickFetchersLocked() {
	for _, s := range e.sources {
		for _, w := range s.fetchers {
			kick(w.kick)
		}
	}
}
