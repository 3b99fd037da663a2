package fetch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// minFetchBudget is the least free memory budget worth a fetch.
const minFetchBudget = 256 << 10

// session is a fetch loop's view of its fetch session (KIP-227): the
// partitions the broker keeps in it, as last sent. Partitions that did not
// change since are left out of the next request, so idle partitions cost
// nothing per fetch.
type session struct {
	id    int32
	epoch int32 // 0: open a new session with a full fetch
	parts map[Key]fetchWant
	// ends is each partition's last stable offset and high watermark as
	// the broker last answered them in this session (see restarted).
	ends map[Key]sourceEnd
}

// sourceEnd is a partition's last stable offset and high watermark.
type sourceEnd struct{ lso, hw int64 }

// fetchWant is one partition a fetch loop asks for.
type fetchWant struct {
	kwire.FetchPartition
	// run and gen name the partition's run in the engine, to notice one
	// that starts again while the session holds it.
	run *partition
	gen int
}

// reset makes the next request a full fetch that opens a new session. It
// keeps the session ID: a full fetch (epoch 0) naming an existing ID makes
// the broker drop that session (FetchManager.newContext, KIP-227), so a
// reset after a lost connection frees the old session's slot in the
// broker's cache instead of leaving it until eviction (franz-go does the
// same).
func (s *session) reset() {
	s.epoch, s.parts, s.ends = 0, map[Key]fetchWant{}, map[Key]sourceEnd{}
}

// build turns the wanted partitions into a full or incremental request.
// restarted lists the partitions the session holds whose run changed (a
// resume after a lost lease, or kmirror resume): in an incremental fetch
// the broker answers only for partitions whose data or offsets changed
// since its last answer (KIP-227), so an idle one that starts again at the
// same offset gets no answer, and its source end must come from ends.
func (s *session) build(req *kwire.FetchRequest, want map[Key]fetchWant) (restarted []Key) {
	req.SessionID, req.SessionEpoch = s.id, s.epoch
	for k, fp := range want {
		old, ok := s.parts[k]
		if s.epoch == 0 || !ok || old.FetchPartition != fp.FetchPartition {
			req.Partitions = append(req.Partitions, fp.FetchPartition)
		}
		if s.epoch != 0 && ok && (old.run != fp.run || old.gen != fp.gen) {
			restarted = append(restarted, k)
		}
	}
	if s.epoch == 0 {
		return restarted
	}
	for k := range s.parts {
		if _, ok := want[k]; !ok {
			req.Forgotten = append(req.Forgotten, kwire.TopicPartition{Topic: k.Topic, Partition: k.Partition})
			delete(s.ends, k)
		}
	}
	return restarted
}

// advance records a successful exchange and the offsets it answered.
func (s *session) advance(want map[Key]fetchWant, id int32, mirror string, res []kwire.FetchedPartition) {
	if s.epoch == 0 {
		if id == 0 {
			return // the broker opened no session: keep sending full fetches
		}
		s.id = id
	}
	s.epoch++
	if s.epoch < 0 {
		s.epoch = 1 // epochs wrap to 1; 0 would open a new session
	}
	s.parts = want
	for _, fp := range res {
		if fp.Err == 0 {
			s.ends[Key{mirror, fp.Topic, fp.Partition}] = sourceEnd{lso: fp.LastStableOffset, hw: fp.HighWatermark}
		}
	}
}

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
	sess := session{parts: map[Key]fetchWant{}, ends: map[Key]sourceEnd{}}
	backoff := e.cfg.RetryBackoff
	var sized time.Time // when slot 0 last sized the broker's fetch loops
	var sizer connSizer
	var answered int // bytes of records in the last answer
	var poll longPoll
	for e.ctx.Err() == nil {
		// Routing news from before this round is in want already.
		select {
		case <-w.routed:
		default:
		}
		want, load, current := e.fetchWanted(mirror, src, w)
		if !current {
			return // replaced: the broker moved to another address
		}
		var req *kwire.FetchRequest
		var reserved int64
		if len(want) > 0 {
			var asked int64
			for _, fw := range want {
				asked += int64(fw.MaxBytes)
			}
			req, reserved = e.newFetchRequest(asked)
		}
		if req == nil {
			// Nothing to fetch, or the memory budget is spent. Keep the
			// session: the next request forgets and adds what changed,
			// instead of opening a new session each time.
			select {
			case <-e.ctx.Done():
				return
			case <-w.kick:
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		restarted := sess.build(req, want)
		var err error
		if conn == nil {
			if conn, err = src.cl.Dial(e.ctx, w.addr); err == nil && w.slot == 0 {
				e.sizeFetchConns(mirror, src, w, &sizer, conn.RTT(false), false)
				sized = time.Now()
			}
		} else if w.slot == 0 && time.Since(sized) >= resizeEvery {
			// Routes change: the kernel keeps measuring the round trip,
			// and follows a change fast only while bulk data comes in.
			bulk := answered >= bulkAnswer
			e.sizeFetchConns(mirror, src, w, &sizer, conn.RTT(bulk), bulk)
			sized = time.Now()
		}
		req.MaxWait = poll.wait(e.cfg, want, load)
		var res *kwire.FetchResponse
		interrupted := false
		if err == nil {
			e.markAsked(want)
			ctx, cancel := context.WithTimeout(e.ctx, req.MaxWait+30*time.Second)
			watched := make(chan bool, 1)
			if req.MaxWait > e.cfg.FetchMaxWait {
				// A long poll: partitions routed here meanwhile end it,
				// instead of waiting for it to run out.
				go func() {
					select {
					case <-w.routed:
						cancel()
						watched <- true
					case <-ctx.Done():
						watched <- false
					}
				}()
			} else {
				watched <- false
			}
			res, err = conn.FetchSession(ctx, req)
			cancel()
			interrupted = <-watched
		}
		if err != nil {
			e.unreserve(reserved)
		}
		if err != nil && interrupted && e.ctx.Err() == nil {
			// Not a failure: the answer may still come on this
			// connection, so it goes, and the session with it.
			conn.Close()
			conn = nil
			sess.reset()
			poll.reset()
			continue
		}
		var kerr *kwire.Error
		if errors.As(err, &kerr) && (kerr.Code == kwire.CodeFetchSessionIDNotFound || kerr.Code == kwire.CodeInvalidFetchSessionEpoch) {
			sess.reset() // the broker evicted or rejects the session: start over
			continue
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
			sess.reset()
			keys := make([]Key, 0, len(want))
			for k := range want {
				keys = append(keys, k)
			}
			e.reroute(keys, err)
			sleepCtx(e.ctx, backoff)
			backoff = min(2*backoff, e.cfg.MaxRetryBackoff)
			continue
		}
		backoff = e.cfg.RetryBackoff
		e.markAnswered(want)
		poll.answered(res.Partitions)
		sess.advance(want, res.SessionID, mirror, res.Partitions)
		answered = 0
		for _, fp := range res.Partitions {
			answered += len(fp.Records)
		}
		src.cl.FetchedBytes.Add(int64(answered))
		e.seedSourceEnds(want, restarted, sess.ends)
		errored := e.handleFetch(mirror, w.broker, w.addr, want, res)
		// The record sets handleFetch queued are charged now: only then
		// does the reservation go (review: given back before, it let
		// other loops reserve the bytes the answer was about to take,
		// up to one answer per loop over the budget).
		e.unreserve(reserved)
		// handleFetch detached the record sets it queued: the others go
		// back to the pool for the next answers.
		res.Release()
		if errored {
			// A partition answered with an error: the broker answers such
			// fetches at once, so pause instead of spinning.
			sleepCtx(e.ctx, e.cfg.RetryBackoff)
		}
	}
}

// markAnswered stamps the partitions a fetch asked for as answered now:
// the broker answered, leaving out those that had not changed.
func (e *Engine) markAnswered(asked map[Key]fetchWant) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range asked {
		if p := e.parts[k]; p != nil {
			p.srcAnswered, p.srcAsked = now, time.Time{}
		}
	}
}

// markAsked stamps the partitions a fetch asks for as waiting on the
// source since now, unless an earlier fetch for them is unanswered.
func (e *Engine) markAsked(asked map[Key]fetchWant) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range asked {
		if p := e.parts[k]; p != nil && p.srcAsked.IsZero() {
			p.srcAsked = now
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// reroute marks partitions of a failed fetch as needing a fresh leader.
func (e *Engine) reroute(keys []Key, err error) {
	e.mu.Lock()
	for _, k := range keys {
		if p, ok := e.parts[k]; ok {
			p.srcLeader = -1
			p.fetchErr = err.Error()
			if kafka.SecurityFailure(err) && p.active() && !p.releasing() {
				e.failLocked(p, err)
			}
		}
	}
	e.mu.Unlock()
	kick(e.kickRt)
}

// fetchWanted returns the partitions a broker's fetch loop should fetch
// now: those it leads with room in their queues, none when the memory
// budget is spent. current is false when the loop was replaced.
func (e *Engine) fetchWanted(mirror string, src *source, w *worker) (want map[Key]fetchWant, load loopLoad, current bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	key := fetcherKey{w.broker, w.slot}
	if src.fetchers[key] != w || e.sources[mirror] != src {
		return nil, load, false
	}
	conns := src.fetchConns(w.broker)
	if w.slot >= conns {
		delete(src.fetchers, key) // fewer loops now: a later increase starts it anew
		return nil, load, false
	}
	if e.cfg.MemoryBudget-e.inUse < minFetchBudget {
		return nil, loopLoad{busy: true}, true
	}
	// Across a long round trip each fetch carries more of a partition
	// (as many times its fetch size as there are loops, up to 4), and a
	// partition may hold that much more queued.
	scale := int32(min(conns, 4))
	limit := int64(e.cfg.PartitionBytes) * 2 * int64(scale)
	want = map[Key]fetchWant{}
	for k, p := range e.parts {
		if k.Mirror != mirror || p.srcLeader != w.broker || fetchSlot(k, conns) != w.slot {
			continue
		}
		if p.queued > 0 {
			load.busy = true
		}
		if !p.wantsFetch(limit) {
			// Only a partition that would be fetched once its queue
			// drains; not one that is stopping or paused.
			if p.queued >= limit && p.mirroring() && p.fetch == fetchOpen {
				load.held = true
			}
			continue
		}
		if p.fetchBytes == 0 {
			p.fetchBytes = e.cfg.PartitionBytes
		}
		want[k] = fetchWant{FetchPartition: kwire.FetchPartition{
			Topic: k.Topic, Partition: k.Partition, Offset: p.fetchOffset,
			LeaderEpoch: p.srcEpoch, MaxBytes: max(p.fetchBytes, e.cfg.PartitionBytes*scale),
		}, run: p, gen: p.gen}
	}
	return want, load, true
}

// seedSourceEnds gives restarted partitions that have no source end yet
// the one the session last answered: the broker leaves a partition out of
// an incremental answer only while its offsets are what it last answered.
func (e *Engine) seedSourceEnds(want map[Key]fetchWant, restarted []Key, ends map[Key]sourceEnd) {
	if len(restarted) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range restarted {
		w := want[k]
		end, known := ends[k]
		if p := e.parts[k]; known && p == w.run && p.gen == w.gen && p.srcEnd < 0 {
			p.srcEnd, p.srcHW = end.lso, end.hw
		}
	}
}

// newFetchRequest sizes a fetch to what its partitions ask for (asked
// bytes, their fetch sizes summed), FetchMaxBytes and the memory budget
// left, and reserves that much of it until the answer is in (unreserve),
// so fetch loops (of several brokers, or several per broker) cannot
// together ask for more than the budget; nil when less than
// minFetchBudget is left. A broker may still return one batch larger
// than MaxBytes (KIP-74), bounded by max.message.bytes.
func (e *Engine) newFetchRequest(asked int64) (*kwire.FetchRequest, int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	free := e.cfg.MemoryBudget - e.inUse
	if free < minFetchBudget {
		return nil, 0
	}
	size := min(int64(e.cfg.FetchMaxBytes), free, max(asked, minFetchBudget))
	e.inUse += size
	return &kwire.FetchRequest{
		MaxWait:       e.cfg.FetchMaxWait,
		MinBytes:      1,
		MaxBytes:      int32(size),
		ReadCommitted: true,
	}, size
}

// unreserve gives back a fetch's reservation.
func (e *Engine) unreserve(n int64) {
	if n == 0 {
		return
	}
	e.mu.Lock()
	e.inUse -= n
	e.kickFetchersLocked()
	e.mu.Unlock()
}

// handleFetch turns a fetch response into produce-queue items.
// It reports whether any partition answered with an error.
func (e *Engine) handleFetch(mirror string, broker int32, addr string, asked map[Key]fetchWant, res *kwire.FetchResponse) (errored bool) {
	kicks := map[int32]bool{}
	for i, fp := range res.Partitions {
		k := Key{mirror, fp.Topic, fp.Partition}
		a, ok := asked[k]
		if !ok {
			continue
		}
		from := a.Offset
		e.mu.Lock()
		p := e.parts[k]
		current := p != nil && p.mirroring() && p.srcLeader == broker && p.fetchOffset == from
		if current {
			p.srcEnd, p.srcHW = fp.LastStableOffset, fp.HighWatermark
			if fp.LogStartOffset > 0 {
				// Breakpoints wholly below the source's log start can
				// never be asked for again: bounded by retention.
				p.xl.Trim(fp.LogStartOffset)
			}
			if fp.Err != 0 {
				e.fetchErrorLocked(p, fp, mirror, addr)
				current, errored = false, true
			} else {
				p.fetchErr = ""
			}
		}
		e.mu.Unlock()
		if !current || len(fp.Records) == 0 {
			continue
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, from)
		e.mu.Lock()
		if !p.mirroring() || p.fetchOffset != from {
			e.mu.Unlock()
			continue // res.Release gives the records back
		}
		if err != nil {
			e.failLocked(p, fmt.Errorf("source data of %s at offset %d: %w", k, from, err))
			e.mu.Unlock()
			continue
		}
		if len(items) == 0 && need > 0 {
			// A batch larger than the partition fetch size: grow to it.
			p.fetchBytes = kafka.GrowFetch(p.fetchBytes, need)
		} else if len(items) > 0 {
			p.fetchBytes = e.cfg.PartitionBytes
		}
		e.queueLocked(p, items, res.Detach(i))
		for _, it := range items {
			if !it.skip() {
				p.fetchedEpoch = it.epoch
			}
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
	return errored
}

// fetchErrorLocked handles a partition-level fetch error.
func (e *Engine) fetchErrorLocked(p *partition, fp kwire.FetchedPartition, mirror, addr string) {
	kerr := &kwire.Error{Code: fp.Err, Topic: fp.Topic, Partition: fp.Partition, Op: "fetch from source cluster of mirror " + mirror, Broker: addr}
	switch {
	case fp.Err == kwire.CodeOffsetOutOfRange:
		// Stop fetching; what was fetched before the hole is produced,
		// then the partition stops DIVERGED at exactly the hole
		// (sourceOutOfRange), so resume --accept-gap continues from there.
		if p.fetch != fetchOutOfRange {
			p.moveFetch(fetchOutOfRange)
			gen, from := p.gen, p.fetchOffset
			e.goLoop(func() { e.sourceOutOfRange(p, gen, from) })
		}
	case kerr.Action() == kwire.RefreshMetadata:
		p.srcLeader = -1
		p.fetchErr = kerr.Error()
		kick(e.kickRt)
	case kerr.Action() == kwire.Retry:
		p.fetchErr = kerr.Error()
	default:
		e.failLocked(p, kerr)
	}
}

// sourceOutOfRange handles a source fetch at offset from that the source
// no longer (or not yet) holds: it reads the source log's bounds, lets the
// batches fetched before from be produced and checkpointed, and then stops
// the partition DIVERGED with the exact range and the way on. Records
// deleted before they were mirrored are never skipped silently (design.md
// invariant 7).
func (e *Engine) sourceOutOfRange(p *partition, gen int, from int64) {
	k := p.key()
	e.mu.Lock()
	src := e.sources[k.Mirror]
	e.mu.Unlock()
	var reason string
	var start, end int64 = -1, -1
	if src != nil {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		var err error
		if start, err = src.cl.ListOffset(ctx, k.Topic, k.Partition, kafka.Earliest); err == nil {
			end, err = src.cl.ListOffset(ctx, k.Topic, k.Partition, kafka.Latest)
		}
		cancel()
		if err != nil {
			start, end = -1, -1
			reason = fmt.Sprintf("source offset %d of %s is outside the source log (reading its bounds failed: %v)", from, k, err)
		}
	}
	switch {
	case reason != "":
	case start > from:
		reason = sourceGapReason(k, from, start)
	case end >= 0 && from > end:
		reason = sourceTruncatedReason(k, from, end)
	default:
		// In range again (a leader change under way): fetch on.
		e.mu.Lock()
		if p.gen == gen {
			p.moveFetch(fetchOpen)
			p.srcLeader = -1
			kick(e.kickRt)
		}
		e.mu.Unlock()
		return
	}
	for {
		e.mu.Lock()
		if p.gen != gen || !p.mirroring() {
			e.mu.Unlock()
			return
		}
		if p.drained() {
			e.mu.Unlock()
			break
		}
		e.mu.Unlock()
		sleepCtx(e.ctx, 50*time.Millisecond)
		if e.ctx.Err() != nil {
			return
		}
	}
	e.checkpoint()
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.gen != gen || !p.mirroring() {
		return
	}
	if end >= 0 {
		p.srcEnd = end
	}
	if start > from {
		p.gapBelow = start
	}
	e.divergeLocked(p, reason)
}
