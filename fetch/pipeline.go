package fetch

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// pipe is one produce connection to a destination broker and its
// requests awaiting answers, in the order sent (fetch/DESIGN.md, the
// produce window). The produce loop sends; receive reads the answers and
// applies them, in order.
type pipe struct {
	conn *kwire.Conn
	// slots holds a token for each request awaiting its answer: at most
	// Config.ProduceWindow.
	slots   chan struct{}
	pending chan pendingProduce
	// broken: a request on conn failed or the connection was reset;
	// nothing more is sent on it, and every request still pending on it
	// fails (its outcome unknown).
	broken atomic.Bool
	// answered counts the requests answered on conn.
	answered atomic.Int64
	done     chan struct{} // closed once receive has settled every request
}

// pendingProduce is a request written to a pipe's connection.
type pendingProduce struct {
	batch           []sent
	req             kwire.PendingProduce
	sentAt, writeBy time.Time
	// fence ends the request's lease-end watch (resetOnLeaseEnd).
	fence func() bool
}

func newPipe(window int) *pipe {
	return &pipe{slots: make(chan struct{}, window), pending: make(chan pendingProduce, window), done: make(chan struct{})}
}

// finish sends nothing more on pp and waits until every request on it is
// settled.
func (pp *pipe) finish() {
	close(pp.pending)
	if pp.conn == nil {
		close(pp.done)
		return
	}
	<-pp.done
}

// produceLoop is the produce loop for one destination broker: each request
// carries the next batch of every ready partition that broker leads, and up
// to Config.ProduceWindow requests await their answers on the connection,
// so a partition has at most that many batches in flight, in sequence
// order; retries resend the same bytes with the same sequence numbers.
func (e *Engine) produceLoop(w *worker) {
	var pp *pipe
	defer func() {
		if pp != nil {
			pp.finish()
			w.conn.Store(nil)
		}
	}()
	backoff := e.cfg.RetryBackoff
	for e.ctx.Err() == nil {
		if pp != nil && pp.broken.Load() {
			// Every request on it settles (its outcome confirmed) before
			// anything is sent on a new connection.
			pp.finish()
			w.conn.Store(nil)
			if pp.answered.Load() == 0 {
				sleepCtx(e.ctx, backoff)
				backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
			} else {
				backoff = e.cfg.RetryBackoff
			}
			pp = nil
			continue
		}
		if pp == nil {
			pp = newPipe(e.cfg.ProduceWindow)
		}
		if pp.conn != nil {
			if throttle := time.Until(pp.conn.ThrottledUntil()); throttle > 0 {
				// The broker reads nothing from this connection until the
				// throttle ends (KIP-219): a request sent now would wait
				// unread and count against produce_timeout.
				sleepCtx(e.ctx, throttle)
			}
		}
		// A slot in the window before anything is collected.
		select {
		case pp.slots <- struct{}{}:
		case <-e.ctx.Done():
			return
		}
		// The broker handles a connection's requests one at a time, each
		// within produce_timeout: a request with n others ahead of it is
		// written by n produce timeouts before the lease's end, so it is
		// still answered within produce_timeout of that end, as a
		// request alone is (lease_margin covers it; fetch/DESIGN.md).
		// A throttled connection is read again only once the throttle
		// ends (KIP-219), which delays every request behind it.
		var throttle time.Duration
		if pp.conn != nil {
			throttle = max(time.Until(pp.conn.ThrottledUntil()), 0)
		}
		ahead := time.Duration(len(pp.slots)-1)*e.cfg.ProduceTimeout + throttle
		if ahead > 0 && !time.Now().Before(e.ctl.WriteDeadlineAhead(ahead)) {
			<-pp.slots
			e.waitKick(w, 100*time.Millisecond)
			continue
		}
		// Read before the lease end the batch goes under: the lease-end
		// reset trusts a renewal only under the same unbroken lease.
		losses := e.ctl.LeaseLosses()
		batch, writeBy, wait, verify, current := e.collectProduce(w, pp)
		if !current {
			<-pp.slots
			return // replaced: the broker moved to another address
		}
		if len(verify) > 0 {
			<-pp.slots
			e.verifyDestinationTopics(verify)
			continue
		}
		if len(batch) == 0 {
			<-pp.slots
			e.waitKick(w, wait)
			continue
		}
		parts := make([]kwire.ProducePartition, len(batch))
		for i, s := range batch {
			k := s.p.key()
			parts[i] = kwire.ProducePartition{Topic: k.Topic, Partition: k.Partition, Batch: s.it.batch}
		}
		if pp.conn == nil {
			conn, err := e.dest.Dial(e.ctx, w.addr)
			if err != nil {
				<-pp.slots
				e.log.Warn("produce failed", zap.String("broker", w.addr), zap.Error(err))
				e.unsend(batch, err)
				sleepCtx(e.ctx, backoff)
				backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
				continue
			}
			// Unacknowledged request bytes are given up with the produce
			// answer's bound, not retransmitted into the broker after the
			// lease (issue 19).
			if uerr := conn.SetUserTimeout(e.cfg.ProduceTimeout + time.Second); uerr != nil {
				e.log.Warn("produce connection keeps the kernel's retransmission timeout", zap.String("broker", w.addr), zap.Error(uerr))
			}
			pp.conn = conn
			w.conn.Store(conn)
			go e.receive(w, pp)
		}
		sentAt := time.Now()
		fence := e.resetOnLeaseEnd(pp.conn, writeBy, losses)
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.ProduceTimeout+10*time.Second)
		sendBy := writeBy
		if ahead > 0 {
			sendBy = minTime(writeBy, e.ctl.WriteDeadlineAhead(ahead))
		}
		req, err := pp.conn.SendProduce(ctx, -1, e.cfg.ProduceTimeout, sendBy, parts)
		cancel()
		if err != nil {
			// Not wholly written (its deadline passed while the broker,
			// busy with the requests ahead, read nothing more, or the
			// connection broke): a partial request is never handled, and
			// is dropped with the connection. The answers owed for the
			// requests ahead are read first (receive resets the connection
			// once they are in), so they are not made unknown.
			fence()
			<-pp.slots
			pp.broken.Store(true)
			if e.ctx.Err() != nil {
				return
			}
			e.log.Warn("produce failed", zap.String("broker", w.addr), zap.Error(err))
			e.unsend(batch, err)
			continue
		}
		pp.pending <- pendingProduce{batch: batch, req: req, sentAt: sentAt, writeBy: writeBy, fence: fence}
	}
}

// waitKick waits until w is kicked (an answer freed the window, a batch
// was queued), d passes, or the engine stops (the loop then ends).
func (e *Engine) waitKick(w *worker, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-e.ctx.Done():
	case <-w.kick:
	case <-t.C:
	}
}

// receive reads the answers to pp's requests in the order they were sent
// and applies them, until the produce loop finishes pp. Once one fails
// (no answer in time, the connection broken or reset at the lease's end)
// the connection is reset and every request after it fails too: their
// outcomes are unknown and confirmed.
func (e *Engine) receive(w *worker, pp *pipe) {
	defer close(pp.done)
	defer pp.conn.Abort()
	var failed error
	for p := range pp.pending {
		var res []kwire.ProduceResult
		err := failed
		if err == nil {
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.ProduceTimeout+10*time.Second)
			res, err = pp.conn.ReceiveProduce(ctx, p.req)
			cancel()
		}
		if p.fence() {
			pp.broken.Store(true)
			e.log.Warn("the lease ended with a produce unanswered: its connection was reset, so nothing of it still in the send buffer is delivered",
				zap.String("broker", w.addr), zap.Int("partitions", len(p.batch)))
		}
		if e.cfg.ProduceObserver != nil {
			e.observeProduce(p.batch, res, err, p.sentAt, p.writeBy)
		}
		switch {
		case err != nil && e.ctx.Err() != nil:
		case err != nil:
			if failed == nil {
				failed = err
				pp.broken.Store(true)
				// A reset, not a close: a request still in the send
				// buffer is discarded, not delivered after the lease.
				pp.conn.Abort()
				e.log.Warn("produce outcome unknown; verifying against the destination", zap.String("broker", w.addr), zap.Error(err))
			}
			e.unknownOutcome(p.batch, err)
		default:
			pp.answered.Add(1)
			e.handleProduce(w, p.batch, res, time.Until(pp.conn.ThrottledUntil()))
		}
		<-pp.slots
		kick(w.kick)
	}
}

// minTime is the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
