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

// collectProduce takes the next batch of every ready partition led by
// broker that has room in its window on pp (fewer than
// Config.ProduceWindow batches in flight, all on pp, none failed),
// assigning sequence numbers the first time a batch is sent: each follows
// the batch before it. wait is how long to sleep when nothing is ready.
// writeBy is the end of this member's lease: nothing is collected after
// it, and the request must be written before it (self-fencing, design.md
// section 3). A partition assigned before the latest lease loss
// (Spec.Fences behind the count read after writeBy, so writeBy is no
// later lease's than the count's) sends nothing until its owner assigns
// it again under the new lease, since it may have moved meanwhile (issue
// 19).
func (e *Engine) collectProduce(w *worker, pp *pipe) (batch []sent, writeBy time.Time, wait time.Duration, verify []*partition, current bool) {
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
		if p.dstLeader != broker || !p.active() {
			continue
		}
		switch {
		case p.send == sendIdle:
			p.popSkips()
			if len(p.queue) == 0 {
				if p.releasing() && p.released != nil {
					closeOnce(p)
				}
				continue
			}
		case p.send == sendInflight && p.inflightOn == pp && p.inflight < e.cfg.ProduceWindow && p.voided == "":
		default:
			continue
		}
		idx, prev := p.nextToSend()
		if idx < 0 || (prev != nil && !p.windowAllowed(prev, now)) {
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
		if now.Sub(p.dstVerified) > destinationVerifyGap && p.inflight == 0 {
			verify = append(verify, p)
			continue
		}
		it := p.queue[idx]
		if size > 0 && size+len(it.batch) > maxProduceBytes {
			wait = 0
			continue
		}
		if !it.seqSet {
			it.seq = p.nextSeq
			if prev != nil {
				it.seq = kwire.NextSequence(prev.seq, prev.count)
			}
			it.seqSet = true
			it.batch.Rewrite(p.producer.ID, p.producer.Epoch, it.seq)
		}
		if p.inflight == 0 {
			p.moveSend(sendInflight)
			p.inflightOn = pp
		}
		p.inflight++
		holdLocked(it)
		it.sentAt = now
		size += len(it.batch)
		batch = append(batch, sent{p: p, it: it, key: p.spec.Key, gen: p.spec.Generation})
	}
	if len(verify) > 0 {
		// Verify first; nothing collected is sent in this round.
		for _, s := range batch {
			e.answeredLocked(s.p, s.it)
		}
		return nil, writeBy, 0, verify, true
	}
	return batch, writeBy, wait, nil, true
}

// answeredLocked takes a batch of p's off its window once its request
// ended (answered, failed, or never sent), and reports whether the
// outcome is to be acted on: the batch is still p's first (it was not
// dropped meanwhile) and no earlier batch of the window failed.
func (e *Engine) answeredLocked(p *partition, it *item) bool {
	// The request no longer reads the batch: its record set may go once
	// the queue lets go too (a dropped queue left it to this).
	e.unrefLocked(it.buf)
	if p.inflight--; p.inflight == 0 {
		p.inflightOn = nil
		p.moveSend(sendIdle)
	}
	return p.voided == "" && p.headBatch() == it
}

// windowFaultLocked handles a failure of p's first batch in flight: act
// now if no later batch of p is in flight; otherwise their answers are
// void (a broker refuses a batch whose predecessor it did not append,
// OUT_OF_ORDER_SEQUENCE, and may have appended one after a predecessor
// that timed out), and once they are all in, what landed is confirmed
// (renew: the producer identity is renewed instead).
func (e *Engine) windowFaultLocked(p *partition, why string, renew bool, act func()) {
	if p.inflight == 0 {
		act()
		return
	}
	p.voided, p.voidRenew, p.voidSpan = why, renew, p.inflight+1
	p.produceErr = why
}

// settleVoidLocked acts on p's void window once its last batch in flight
// has ended.
func (e *Engine) settleVoidLocked(p *partition) {
	if p.inflight > 0 || p.voided == "" {
		return
	}
	why, renew := p.voided, p.voidRenew
	p.voided, p.voidRenew, p.voidSpan = "", false, 0
	if !p.active() {
		return
	}
	if renew {
		e.renewIdentityLocked(p, why)
		return
	}
	e.confirmLocked(p, why)
}

// renewIdentityLocked stops p and asks the control plane for a new
// producer epoch: the broker lost the producer's state (expiry,
// retention), a late copy reset it, or another owner fenced this epoch;
// the walk after the renewal verifies.
func (e *Engine) renewIdentityLocked(p *partition, why string) {
	e.log.Warn("destination refused the producer identity; asking the control plane for a new epoch",
		zap.Stringer("partition", p.key()), zap.String("error", why))
	e.handBackLocked(p, why)
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
// opened, or the request was not wholly written) to their queues, to be
// sent once routed again.
func (e *Engine) unsend(batch []sent, err error) {
	e.mu.Lock()
	for _, s := range batch {
		p := s.p
		e.answeredLocked(p, s.it)
		// Batches of p still in flight before it settle on their own
		// connection (a failure there voids the window).
		e.settleVoidLocked(p)
		p.dstLeader = -1
		p.produceErr = err.Error()
		if kafka.SecurityFailure(err) && p.active() && !p.releasing() {
			e.failLocked(p, err)
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
		p := s.p
		if unanswered && p.dstUnanswered.IsZero() {
			p.dstUnanswered = p.sentAt
		}
		if !e.answeredLocked(p, s.it) {
			e.settleVoidLocked(p)
			continue
		}
		if p.active() {
			why := fmt.Sprintf("produce to destination %s/%d: outcome unknown (%v)", p.key().Topic, p.key().Partition, err)
			e.windowFaultLocked(p, why, false, func() { e.confirmLocked(p, why) })
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
		if !e.answeredLocked(p, it) {
			e.settleVoidLocked(p) // dropped meanwhile (failed or diverged), or void
			continue
		}
		k := p.key()
		r, ok := byKey[Key{Topic: k.Topic, Partition: k.Partition}]
		if !ok {
			why := fmt.Sprintf("destination %s/%d: the produce response has no answer for the partition", k.Topic, k.Partition)
			e.windowFaultLocked(p, why, false, func() { e.confirmLocked(p, why) })
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
			why := fmt.Sprintf("destination %s/%d: batch for source offsets %d..%d landed at offset %d, expected %d",
				k.Topic, k.Partition, it.srcFirst, it.srcNext-1, r.BaseOffset, p.pos.DestinationOffset)
			e.windowFaultLocked(p, why, false, func() { e.confirmLocked(p, why) })
			continue
		}
		p.popSkips()
		p.ack(it, r.BaseOffset)
		p.acked, p.ackedMaxTs = true, it.batch.MaxTimestamp()
		now := time.Now()
		p.progress.mirrored(now, int64(it.count), it.size)
		p.dstVerified = now
		p.produceErr = ""
		p.queue = p.queue[1:]
		e.dequeueLocked(p, it)
		p.failures = 0
		// Skip items right behind it: every batch before them is in.
		p.popSkips()
		if p.inflight > 0 {
			if h := p.headBatch(); h != nil {
				p.sentAt = h.sentAt
			}
		}
		if p.releasing() && p.drained() && p.released != nil {
			closeOnce(p)
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
		e.windowFaultLocked(p, msg, true, func() { e.renewIdentityLocked(p, msg) })
	case resendRerouted:
		p.dstLeader = -1
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		kick(e.kickRt)
		e.windowFaultLocked(p, msg, false, func() { p.produceErr = msg })
	case resendAsIs:
		p.retryAt = time.Now().Add(e.cfg.RetryBackoff)
		e.windowFaultLocked(p, msg, false, func() { p.produceErr = msg })
	case confirmFirst:
		e.windowFaultLocked(p, msg, false, func() { e.confirmLocked(p, msg) })
	default:
		if it := p.headBatch(); r.Err == kwire.CodeMessageTooLarge && it != nil {
			msg += fmt.Sprintf(": the batch of source offsets %d..%d is %d bytes, more than destination topic %s accepts; "+
				"raise max.message.bytes of that topic to at least %d (kafka-configs.sh --alter --entity-type topics --entity-name %s "+
				"--add-config max.message.bytes=%d); kmirror retries the same batch",
				it.srcFirst, it.srcNext-1, len(it.batch), r.Topic, len(it.batch), r.Topic, len(it.batch))
		}
		// The partition restarts with a walk once every batch of it in
		// flight has ended (waitIdle): no confirm of its own.
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
