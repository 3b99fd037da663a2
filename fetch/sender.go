package fetch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// maxProduceBytes bounds one produce request (brokers accept 100 MiB).
const maxProduceBytes = 32 << 20

// sent is one partition's batch in a produce request.
type sent struct {
	p  *partition
	it *item
	// key and gen are the partition's and its lease generation when it
	// was collected (read under the engine's lock).
	key Key
	gen uint64
}

// produceLoop is the produce loop for one destination broker: each request
// carries the head batch of every ready partition that broker leads, so
// each partition has at most one batch in flight and retries resend the
// same bytes with the same sequence numbers.
func (e *Engine) produceLoop(w *worker) {
	var conn *kwire.Conn
	defer func() {
		if conn != nil {
			conn.Abort()
		}
	}()
	backoff := e.cfg.RetryBackoff
	for e.ctx.Err() == nil {
		// Read before the lease end the batch goes under: the lease-end
		// reset trusts a renewal only under the same unbroken lease.
		losses := e.ctl.LeaseLosses()
		batch, writeBy, wait, verify, current := e.collectProduce(w)
		if !current {
			return // replaced: the broker moved to another address
		}
		if len(verify) > 0 {
			e.verifyDestinationTopics(verify)
			continue
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
			if conn, err = e.dest.Dial(e.ctx, w.addr); err == nil {
				// Unacknowledged request bytes are given up with the
				// produce answer's bound, not retransmitted into the
				// broker after the lease (issue 19).
				if uerr := conn.SetUserTimeout(e.cfg.ProduceTimeout + time.Second); uerr != nil {
					e.log.Warn("produce connection keeps the kernel's retransmission timeout", zap.String("broker", w.addr), zap.Error(uerr))
				}
				w.conn.Store(conn)
			}
		}
		sent := err == nil
		var res []kwire.ProduceResult
		reset := false
		if sent {
			sentAt := time.Now()
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.ProduceTimeout+10*time.Second)
			fence := e.resetOnLeaseEnd(conn, writeBy, losses)
			res, err = conn.Produce(ctx, -1, e.cfg.ProduceTimeout, writeBy, parts)
			if reset = fence(); reset {
				e.log.Warn("the lease ended with a produce unanswered: its connection was reset, so nothing of it still in the send buffer is delivered",
					zap.String("broker", w.addr), zap.Int("partitions", len(parts)))
			}
			cancel()
			// A request the broker never wholly received (the lease ran out
			// while writing it, or the connection broke) was not appended.
			sent = !errors.Is(err, kwire.ErrNotSent)
			if sent && e.cfg.ProduceObserver != nil {
				e.observeProduce(batch, res, err, sentAt, writeBy)
			}
		}
		if err != nil {
			if conn != nil {
				// A reset, not a close: a request still in the send
				// buffer is discarded, not delivered after the lease.
				w.conn.Store(nil)
				conn.Abort()
				conn = nil
			}
			if e.ctx.Err() != nil {
				return
			}
			if sent {
				// The request may have been appended: confirm before resending.
				e.log.Warn("produce outcome unknown; verifying against the destination", zap.String("broker", w.addr), zap.Error(err))
				e.unknownOutcome(batch, err)
			} else {
				// Nothing was sent: send once routed again.
				e.log.Warn("produce failed", zap.String("broker", w.addr), zap.Error(err))
				e.unsend(batch, err)
			}
			sleepCtx(e.ctx, backoff)
			backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
			continue
		}
		backoff = e.cfg.RetryBackoff
		throttle := time.Until(conn.ThrottledUntil())
		if reset {
			// The answer came as the lease end reset the connection: it
			// counts, but the connection is gone.
			w.conn.Store(nil)
			conn = nil
		}
		e.handleProduce(w, batch, res, throttle)
		if throttle > 0 {
			// The broker reads nothing from this connection until the
			// throttle ends (KIP-219): a request sent now would wait
			// unread and count against produce_timeout.
			sleepCtx(e.ctx, throttle)
		}
	}
}

// resetOnLeaseEnd resets conn (RST, SO_LINGER 0) if this member's lease
// ends while a request on it is unanswered: what of it is still in the
// socket's send buffer is discarded, not delivered into the broker after
// the lease (issue 19: the write deadline bounds the send buffer, not
// delivery). writeBy is the lease end the request was sent under, losses
// the lease-loss count read before it (Control.LeaseLosses); at writeBy
// the lease is read again, and one renewed with no loss since is waited
// out instead. The returned stop ends the watch and reports whether it
// reset conn.
func (e *Engine) resetOnLeaseEnd(conn *kwire.Conn, writeBy time.Time, losses uint64) (stop func() bool) {
	var (
		mu                sync.Mutex
		timer             *time.Timer
		stopped, didReset bool
	)
	var arm func(at time.Time)
	arm = func(at time.Time) {
		timer = time.AfterFunc(time.Until(at), func() {
			mu.Lock()
			defer mu.Unlock()
			if stopped {
				return
			}
			// A renewed lease is waited out, not one that lapsed and was
			// granted again since the request was sent (a timer that
			// fired late, the process frozen): the request went under
			// the lapsed one. The count is read after the deadline: a
			// loss is counted before any later grant's deadline exists.
			next := e.ctl.WriteDeadline()
			if e.ctl.LeaseLosses() == losses && time.Now().Before(next) {
				arm(next)
				return
			}
			didReset = true
			_ = conn.Abort() // the produce loop sees the request fail
		})
	}
	mu.Lock()
	arm(writeBy)
	mu.Unlock()
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		timer.Stop()
		return didReset
	}
}

// observeProduce tells Config.ProduceObserver about each batch of a
// request the broker may have received.
func (e *Engine) observeProduce(batch []sent, res []kwire.ProduceResult, err error, sentAt, writeBy time.Time) {
	endedAt := time.Now()
	for _, s := range batch {
		k := s.key
		ev := ProduceEvent{Key: k, Generation: s.gen, ProducerID: s.it.batch.ProducerID(), ProducerEpoch: s.it.batch.ProducerEpoch(),
			BaseSequence: s.it.batch.BaseSequence(), Records: s.it.batch.RecordCount(), SentAt: sentAt, WriteBy: writeBy,
			EndedAt: endedAt, Answered: err == nil, BaseOffset: -1}
		for _, r := range res {
			if r.Topic == k.Topic && r.Partition == k.Partition {
				ev.ErrorCode = r.Err
				if r.Err == 0 {
					ev.BaseOffset = r.BaseOffset
				}
			}
		}
		e.cfg.ProduceObserver(ev)
	}
}

// collectProduce takes the head batch of every ready partition led by
// broker, assigning sequence numbers the first time a batch is sent. wait
// is how long to sleep when nothing is ready. writeBy is the end of this
// member's lease: nothing is collected after it, and the request must be
// written before it (self-fencing, design.md section 3). A partition
// assigned before the latest lease loss (Spec.Fences behind the count read
// after writeBy, so writeBy is no later lease's than the count's) sends
// nothing until its owner assigns it again under the new lease, since it
// may have moved meanwhile (issue 19).
func (e *Engine) collectProduce(w *worker) (batch []sent, writeBy time.Time, wait time.Duration, verify []*partition, current bool) {
	writeBy = e.ctl.WriteDeadline()
	losses := e.ctl.LeaseLosses()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.senders[w.broker] != w {
		return nil, writeBy, 0, nil, false
	}
	broker := w.broker
	wait = time.Second
	now := time.Now()
	fenced := !now.Before(writeBy)
	size := 0
	for _, p := range e.parts {
		if p.dstLeader != broker || !p.active() || p.send != sendIdle {
			continue
		}
		for len(p.queue) > 0 && p.queue[0].skip() {
			p.skipped(p.queue[0])
			p.queue = p.queue[1:]
		}
		if len(p.queue) == 0 {
			if p.releasing() && p.released != nil {
				closeOnce(p)
			}
			continue
		}
		if now.Before(p.retryAt) {
			wait = min(wait, p.retryAt.Sub(now))
			continue
		}
		if fenced {
			p.produceErr = "lease: this member has not heard from the raft leader in time; it writes nothing until it does (the leader moves its partitions after lease_ttl)"
			wait = min(wait, 100*time.Millisecond)
			continue
		}
		if p.spec.Fences != losses {
			p.produceErr = "lease: lost since this partition was assigned here; it writes nothing until its owner assigns it again under the new lease"
			wait = min(wait, 100*time.Millisecond)
			continue
		}
		if now.Sub(p.dstVerified) > destinationVerifyGap {
			verify = append(verify, p)
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
		p.moveSend(sendInflight)
		size += len(it.batch)
		batch = append(batch, sent{p: p, it: it, key: p.spec.Key, gen: p.spec.Generation})
	}
	if len(verify) > 0 {
		// Verify first; nothing collected is sent in this round.
		for _, s := range batch {
			s.p.moveSend(sendIdle)
		}
		return nil, writeBy, 0, verify, true
	}
	return batch, writeBy, wait, nil, true
}

// destinationVerifyGap is how long a partition may go without a produce
// before its destination topic's ID is checked again (fresh metadata)
// before the next one. A topic deleted while batches flow makes them
// fail (and the partition is routed again, which checks the ID); a topic
// deleted and recreated while the partition was idle would take the next
// batch silently, as produce requests name topics, not topic IDs.
const destinationVerifyGap = 200 * time.Millisecond

// verifyDestinationTopics checks, with metadata fetched now, that the
// destination topics of ps are the ones kmirror created; a recreated one
// stops its partition DIVERGED before anything is written into it.
func (e *Engine) verifyDestinationTopics(ps []*partition) {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	for _, p := range ps {
		e.mu.Lock()
		k := p.key()
		e.mu.Unlock()
		e.dest.Watch(k.Topic)
	}
	if _, err := e.dest.MetadataSince(ctx, start); err != nil {
		e.log.Debug("verify destination topics", zap.Error(err))
		e.mu.Lock()
		for _, p := range ps {
			p.produceErr = "produce to destination waits: checking the destination topic before writing failed: " + err.Error()
		}
		e.mu.Unlock()
		sleepCtx(e.ctx, e.cfg.RetryBackoff)
		return
	}
	for _, p := range ps {
		err := e.checkTopicID(ctx, e.dest, p, "destination")
		e.mu.Lock()
		var dv *Divergence
		switch {
		case errors.As(err, &dv):
			if p.active() {
				e.divergeLocked(p, dv.Reason)
			}
		case err == nil:
			p.dstVerified = time.Now()
		default:
			p.produceErr = "produce to destination waits: checking the destination topic before writing failed: " + err.Error()
		}
		e.mu.Unlock()
	}
}

// unsend returns batches that were not sent (the connection could not be
// opened) to their queues, to be sent once routed again.
func (e *Engine) unsend(batch []sent, err error) {
	e.mu.Lock()
	for _, s := range batch {
		s.p.moveSend(sendIdle)
		s.p.dstLeader = -1
		s.p.produceErr = err.Error()
		if kafka.SecurityFailure(err) && s.p.active() && !s.p.releasing() {
			e.failLocked(s.p, err)
		}
	}
	e.mu.Unlock()
	kick(e.kickRt)
}

// unknownOutcome handles a produce request that failed after it was sent:
// every batch in it may have been appended.
func (e *Engine) unknownOutcome(batch []sent, err error) {
	unanswered := errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range batch {
		if unanswered && s.p.dstUnanswered.IsZero() {
			s.p.dstUnanswered = s.p.sentAt
		}
		s.p.moveSend(sendIdle)
		if s.p.active() && len(s.p.queue) > 0 && s.p.queue[0] == s.it {
			e.confirmLocked(s.p, fmt.Sprintf("produce to destination %s/%d: outcome unknown (%v)", s.p.key().Topic, s.p.key().Partition, err))
		}
	}
}

// handleProduce applies a produce response from w's broker; throttle is
// what is left of the throttle it asked for (<= 0: none), recorded on the
// batch's partitions and the broker's total.
func (e *Engine) handleProduce(w *worker, batch []sent, res []kwire.ProduceResult, throttle time.Duration) {
	byKey := make(map[Key]kwire.ProduceResult, len(res))
	for _, r := range res {
		byKey[Key{Topic: r.Topic, Partition: r.Partition}] = r
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	throttled := ""
	if throttle > 0 {
		if e.throttled == nil {
			e.throttled = map[string]time.Duration{}
		}
		e.throttled[w.addr] += throttle
		throttled = fmt.Sprintf("throttled: destination broker %s asked kmirror to wait %d ms before producing again "+
			"(a client quota on the destination; KIP-219)", w.addr, throttle.Milliseconds())
	}
	for _, s := range batch {
		p, it := s.p, s.it
		p.throttled = throttled
		p.dstUnanswered = time.Time{}
		p.moveSend(sendIdle)
		k := p.key()
		if len(p.queue) == 0 || p.queue[0] != it {
			continue // dropped meanwhile (failed or diverged)
		}
		r, ok := byKey[Key{Topic: k.Topic, Partition: k.Partition}]
		if !ok {
			e.confirmLocked(p, fmt.Sprintf("destination %s/%d: the produce response has no answer for the partition", k.Topic, k.Partition))
			continue
		}
		if r.Err != 0 {
			e.produceErrorLocked(p, r)
			continue
		}
		if r.BaseOffset != p.pos.DestinationOffset {
			// Someone wrote before it: another producer, or a late copy of
			// one of kmirror's own batches. confirm reads which.
			e.log.Warn("batch landed at an unexpected destination offset; verifying what the destination holds",
				zap.Stringer("partition", k), zap.Int64("offset", r.BaseOffset), zap.Int64("expected", p.pos.DestinationOffset))
			e.confirmLocked(p, fmt.Sprintf("destination %s/%d: batch for source offsets %d..%d landed at offset %d, expected %d",
				k.Topic, k.Partition, it.srcFirst, it.srcNext-1, r.BaseOffset, p.pos.DestinationOffset))
			continue
		}
		p.ack(it, r.BaseOffset)
		p.dstVerified = time.Now()
		p.produceErr = ""
		p.queue = p.queue[1:]
		p.queued -= it.size
		e.inUse -= it.size
		p.failures = 0
		if p.releasing() && p.drained() {
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

// produceAction is what the data path does about a partition-level
// produce error (fetch/DESIGN.md, "What kmirror does").
type produceAction int

const (
	// resendAsIs: rejected before the append; send the same bytes again.
	resendAsIs produceAction = iota + 1
	// resendRerouted: as resendAsIs, to the leader fresh metadata names.
	resendRerouted
	// confirmFirst: the batch may be in the log; confirm before resending.
	confirmFirst
	// renewIdentity: the broker refuses the producer's identity or
	// sequence; the partition stops and the control plane bumps its epoch
	// through raft (never the engine on its own: in a group a local renewal
	// would let a late batch of the old identity land as a duplicate).
	renewIdentity
	// failPartition: the batch can never be accepted as it is.
	failPartition
)

// beforeAppend lists the produce errors a broker returns only before it
// appends anything (ReplicaManager.appendToLocalLog and
// Partition.appendRecordsToLeader). Every other error may come after the
// append (a DelayedProduce that expired, lost leadership or saw the ISR
// shrink), and NOT_LEADER_OR_FOLLOWER comes both ways.
var beforeAppend = map[int16]bool{
	kwire.CodeUnknownTopicOrPartition: true,
	kwire.CodeLeaderNotAvailable:      true,
	kwire.CodeNotEnoughReplicas:       true,
}

// classifyProduceError returns what to do about a partition's produce
// error code.
func classifyProduceError(code int16) produceAction {
	action := kwire.Classify(code)
	switch {
	case code == kwire.CodeOutOfOrderSequence || code == kwire.CodeUnknownProducerID || code == kwire.CodeInvalidProducerEpoch:
		return renewIdentity
	case beforeAppend[code] && action == kwire.RefreshMetadata:
		return resendRerouted
	case beforeAppend[code]:
		return resendAsIs
	case code == kwire.CodeDuplicateSequence || action != kwire.Fatal:
		// DUPLICATE_SEQUENCE_NUMBER: the batch is in already, at an offset
		// the answer does not give.
		return confirmFirst
	}
	return failPartition
}

// produceErrorLocked handles a partition-level produce error.
func (e *Engine) produceErrorLocked(p *partition, r kwire.ProduceResult) {
	msg := (&kwire.Error{Code: r.Err, Topic: r.Topic, Partition: r.Partition, Op: "produce to destination"}).Error()
	if r.Message != "" {
		msg += " (" + r.Message + ")"
	}
	switch classifyProduceError(r.Err) {
	case renewIdentity:
		// The broker lost our producer state (expiry, retention), a late
		// copy reset it, or another owner fenced this epoch: stop and let
		// the control plane renew it; the walk after that verifies.
		e.log.Warn("destination refused the producer identity; asking the control plane for a new epoch",
			zap.Stringer("partition", p.key()), zap.String("error", msg))
		e.handBackLocked(p, msg)
	case resendRerouted:
		p.dstLeader = -1
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		p.produceErr = msg
		kick(e.kickRt)
	case resendAsIs:
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		p.produceErr = msg
	case confirmFirst:
		e.confirmLocked(p, msg)
	default:
		if r.Err == kwire.CodeMessageTooLarge && len(p.queue) > 0 {
			it := p.queue[0]
			msg += fmt.Sprintf(": the batch of source offsets %d..%d is %d bytes, more than destination topic %s accepts; "+
				"raise max.message.bytes of that topic to at least %d (kafka-configs.sh --alter --entity-type topics --entity-name %s "+
				"--add-config max.message.bytes=%d); kmirror retries the same batch",
				it.srcFirst, it.srcNext-1, len(it.batch), r.Topic, len(it.batch), r.Topic, len(it.batch))
		}
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
