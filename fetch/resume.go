package fetch

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// Divergence means the source and destination disagree: the partition
// stops (DIVERGED) and needs an operator. It is never retried silently.
type Divergence struct {
	Key    Key
	Reason string
}

func (d *Divergence) Error() string { return fmt.Sprintf("%s diverged: %s", d.Key, d.Reason) }

// sourceBehind means the destination holds records past what the source
// serves now. Right after a source leader change the new leader's last
// stable offset can briefly lag, so this is retried a few times
// (behindRetries) before it counts as a divergence.
type sourceBehind struct{ Divergence }

const behindRetries = 5

// resume takes over a partition exactly (design.md section 4): adopt the
// producer identity, read the last checkpoint, walk source and destination
// from it up to the destination's high watermark verifying every record,
// and start mirroring after the last verified batch with the next sequence.
func (e *Engine) resume(ctx context.Context, p *partition, gen int) error {
	e.mu.Lock()
	spec := p.spec
	src := e.sources[spec.Key.Mirror]
	e.mu.Unlock()
	k := spec.Key
	if src == nil {
		return fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
	}
	if err := e.waitIdle(ctx, p, gen); err != nil {
		return err
	}
	if err := e.store.catchUp(ctx); err != nil {
		return fmt.Errorf("read checkpoints: %w", err)
	}
	cp, hasCP, entries := e.store.load(k)
	if h := spec.Handoff; h != nil {
		if hasCP && cp.Src == h.Position.SourceOffset && cp.Dst == h.Position.DestinationOffset && cp.PID == h.Producer.ID && cp.Epoch == h.Producer.Epoch {
			return e.startHandoff(p, gen, *h, entries)
		}
		e.log.Warn("handoff position is not the last checkpoint; resuming with a walk", zap.Stringer("partition", k),
			zap.Int64("handoff_source_offset", h.Position.SourceOffset), zap.Int64("checkpoint_source_offset", cp.Src))
	}
	var pid ProducerID
	if spec.Producer != nil {
		pid = *spec.Producer
	} else {
		var err error
		if pid, err = e.destAdmin.InitProducerID(ctx); err != nil {
			return err
		}
		if err := e.ctl.SaveProducer(ctx, k, spec.Generation, pid); err != nil {
			return fmt.Errorf("save producer identity of %s: %w", k, err)
		}
		// Allocated once: a failed walk below must not allocate again.
		e.mu.Lock()
		if p.gen == gen {
			p.spec.Producer = &pid
		}
		e.mu.Unlock()
	}
	start := Entry{Src: spec.StartOffset}
	// Every identity the partition wrote with since the checkpoint is
	// kmirror's own: a late copy carrying one of them is a duplicate, not
	// a foreign write (an identity renewed after OUT_OF_ORDER_SEQUENCE).
	own := ownSeqs{pid: 0}
	if hasCP {
		start = Entry{Src: cp.Src, Dst: cp.Dst}
		if cp.PID >= 0 {
			own[ProducerID{ID: cp.PID, Epoch: cp.Epoch}] = cp.Seq
		}
	}
	e.mu.Lock()
	for id, next := range p.own {
		if _, ok := own[id]; !ok {
			own[id] = next
		}
	}
	e.mu.Unlock()
	var xl Translation
	xl.Restore(entries, start)
	w, err := e.walk(ctx, src.cl, k, start, pid, own, &xl)
	if err != nil {
		return err
	}
	seq := w.nextSeq
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.staleStartLocked(p, gen) {
		return nil
	}
	e.noteDuplicatesLocked(p, w.duplicates)
	e.mirrorFromLocked(p, pid, seq, w.own, Position{SourceOffset: w.end.Src, DestinationOffset: w.end.Dst, SourceLeaderEpoch: w.epoch}, xl, w.entries)
	e.log.Info("partition resumed", zap.Stringer("partition", k), zap.Int64("source_offset", w.end.Src),
		zap.Int64("destination_offset", w.end.Dst), zap.Int64("walked_records", w.walked),
		zap.Int64("producer_id", pid.ID), zap.Int32("sequence", seq))
	return nil
}

// staleStartLocked reports whether the start of p that began in gen was
// overtaken (a restart, or a release that is now waiting for it).
func (e *Engine) staleStartLocked(p *partition, gen int) bool {
	if p.gen == gen && !p.draining {
		return false
	}
	if p.draining && p.released != nil {
		closeOnce(p)
	}
	return true
}

// mirrorFromLocked sets p mirroring from pos with producer identity pid at
// sequence seq (own: every identity of the partition with its next
// sequence), the translation xl, and unsaved breakpoints to checkpoint.
func (e *Engine) mirrorFromLocked(p *partition, pid ProducerID, seq int32, own ownSeqs, pos Position, xl Translation, unsaved []Entry) {
	p.producer, p.spec.Producer, p.resumed = pid, &pid, true
	p.nextSeq, p.own = seq, own
	p.confirming = false
	p.pos = pos
	p.xl = xl
	p.xl.Advance(pos.SourceOffset, pos.DestinationOffset)
	p.unsaved, p.dirty = unsaved, true
	p.fetchOffset = pos.SourceOffset
	p.fetchBytes = e.cfg.PartitionBytes
	p.srcLeader, p.dstLeader = -1, -1
	p.failures = 0
	e.setStateLocked(p, Mirroring, "")
	kick(e.kickRt)
}

// startHandoff continues a partition exactly where its previous owner
// drained it (design.md section 3, graceful handoff): same producer
// identity, next sequence, position and translation, no walk. The previous
// owner acknowledged every batch it sent and wrote this checkpoint before
// it released the partition through raft, so nothing of its can land later.
func (e *Engine) startHandoff(p *partition, gen int, h Handoff, entries []Entry) error {
	start := Entry{Src: h.Position.SourceOffset, Dst: h.Position.DestinationOffset}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.staleStartLocked(p, gen) {
		return nil
	}
	pid := h.Producer
	var xl Translation
	xl.Restore(entries, start)
	e.mirrorFromLocked(p, pid, h.Sequence, ownSeqs{pid: h.Sequence}, h.Position, xl, nil)
	e.log.Info("partition taken over by handoff", zap.Stringer("partition", p.key()), zap.Int64("source_offset", start.Src),
		zap.Int64("destination_offset", start.Dst), zap.Int64("producer_id", pid.ID), zap.Int32("sequence", h.Sequence))
	return nil
}

// waitIdle waits until no produce of p's is in flight, so the walk sees
// every batch an earlier run of the partition may still land. It gives up
// waiting when p is restarted past gen (any gen < 0 never is).
func (e *Engine) waitIdle(ctx context.Context, p *partition, gen int) error {
	for {
		e.mu.Lock()
		idle := !p.inflight || (gen >= 0 && p.gen != gen)
		e.mu.Unlock()
		if idle {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// walkResult is where a walk ended.
type walkResult struct {
	end     Entry // next source offset and destination offset (the log end)
	epoch   int32
	nextSeq int32   // next sequence of the walk's current producer identity
	own     ownSeqs // every own identity's next sequence at the end
	entries []Entry
	walked  int64
	// duplicates are batches of kmirror's own producer identity found again
	// on the destination; the walk steps over them.
	duplicates []duplicate
}

// duplicate is a batch kmirror itself wrote a second time: a resend or a
// late request the destination broker could not de-duplicate because it
// had dropped the producer's state (fetch/DESIGN.md).
type duplicate struct {
	first, last int64 // destination offsets
	producer    ProducerID
	seq         int32 // base sequence, one that was already acknowledged
}

func (d duplicate) records() int64 { return d.last - d.first + 1 }

func (d duplicate) String() string {
	return fmt.Sprintf("destination offsets %d..%d repeat an earlier batch of kmirror's own producer (ID %d, epoch %d, base sequence %d): "+
		"a resend or a late request landed twice because the destination broker had dropped the producer's state "+
		"(producer.id.expiration.ms counts from the records' timestamps); nothing was lost, mirroring continued after it",
		d.first, d.last, d.producer.ID, d.producer.Epoch, d.seq)
}

// ownSeqs maps each producer identity kmirror wrote a partition with to
// the next sequence number it would use there.
type ownSeqs map[ProducerID]int32

func (o ownSeqs) clone() ownSeqs {
	c := make(ownSeqs, len(o))
	for k, v := range o {
		c[k] = v
	}
	return c
}

// seqBehind reports whether a batch starting at sequence seq lies before
// next in the producer's sequence space (which wraps at 2^31, like
// Kafka's): its sequence range was used already.
func seqBehind(seq, next int32) bool {
	d := (int64(next) - int64(seq) + 1<<31) % (1 << 31)
	return d > 0 && d <= 1<<30
}

// uncommittedPoll is how often a walk re-reads a destination partition
// whose leader holds records above the high watermark.
const uncommittedPoll = 100 * time.Millisecond

// walk reads the destination from start.Dst to the end of the leader's log
// and the source from start.Src, through the same filter the data path
// applies, and checks that they hold the same records in the same order.
// own holds kmirror's producer identities for the partition with the next
// sequence of each as of start; pid, the one it writes with now, is among
// them. The walk works on a copy.
//
// It reads up to the log end offset, not only the high watermark: a batch
// appended but not yet replicated (above the high watermark on a
// replicated partition) is either committed later or truncated away by a
// leader change, and the walk waits until one of them has happened (the
// leader's log end offset, asked with OffsetForLeaderEpoch, is then at or
// below the high watermark). Deciding earlier would let such a batch
// become visible after the walk as a duplicate of what is sent next.
//
// A destination batch of one of these identities whose sequence lies
// before that identity's next one is kmirror's own duplicate: stepped over
// and returned in duplicates. Any other record that does not match the
// source is a Divergence.
func (e *Engine) walk(ctx context.Context, srcCl *cluster, k Key, start Entry, pid ProducerID, own ownSeqs, xl *Translation) (res walkResult, err error) {
	res = walkResult{end: start, own: own.clone()}
	defer func() { res.nextSeq = res.own[pid] }()
	done, err := e.walkSlot(ctx)
	if err != nil {
		return res, err
	}
	defer done()
	dst, err := openPartitionReader(ctx, e.dest, k.Topic, k.Partition, start.Dst, false)
	if err != nil {
		return res, err
	}
	defer dst.close()
	srcIt := &sourceIter{}
	if srcIt.r, err = openPartitionReader(ctx, srcCl, k.Topic, k.Partition, start.Src, true); err != nil {
		return res, err
	}
	defer srcIt.r.close()
	diverge := func(format string, args ...any) error {
		return &Divergence{Key: k, Reason: fmt.Sprintf(format, args...)}
	}
	ownID := func(b kwire.Batch) (ProducerID, bool) {
		id := ProducerID{ID: b.ProducerID(), Epoch: b.ProducerEpoch()}
		_, ok := res.own[id]
		return id, ok && id.ID >= 0
	}
	writer := func(b kwire.Batch) string {
		if id, ok := ownID(b); ok {
			return fmt.Sprintf("written by kmirror's producer ID %d", id.ID)
		}
		return fmt.Sprintf("written by producer ID %d, kmirror's is %d: another producer has written to the destination partition "+
			"(mirror topics must stay read-only until failover)", b.ProducerID(), pid.ID)
	}
	for {
		batches, hw, err := dst.next(ctx)
		if err != nil {
			return res, err
		}
		if len(batches) == 0 {
			if res.end.Dst < hw {
				return res, fmt.Errorf("destination %s/%d: no data readable at offset %d below high watermark %d", k.Topic, k.Partition, res.end.Dst, hw)
			}
			leo, err := dst.logEndOffset(ctx)
			if err != nil {
				return res, err
			}
			if leo <= hw {
				return res, nil
			}
			// Records above the high watermark: wait until they are
			// committed (or a leader change truncates them).
			sleepCtx(ctx, uncommittedPoll)
			if err := ctx.Err(); err != nil {
				return res, err
			}
			continue
		}
		for _, b := range batches {
			if b.BaseOffset() < res.end.Dst {
				return res, diverge("destination batch %d..%d starts before the checkpointed offset %d", b.BaseOffset(), b.LastOffset(), res.end.Dst)
			}
			if id, ok := ownID(b); ok && seqBehind(b.BaseSequence(), res.own[id]) {
				res.duplicates = append(res.duplicates, duplicate{first: b.BaseOffset(), last: b.LastOffset(), producer: id, seq: b.BaseSequence()})
				res.end.Dst = b.LastOffset() + 1
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return res, fmt.Errorf("destination %s/%d: %w", k.Topic, k.Partition, err)
			}
			for _, r := range recs {
				sr, ok, err := srcIt.next(ctx)
				if err != nil {
					return res, err
				}
				if !ok {
					return res, &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
						"destination offset %d (%s) holds a record beyond the source's committed data (source offset %d): "+
							"the destination was written by someone else or the source lost records", r.Offset, writer(b), srcIt.r.offset)}}
				}
				if why := recordDiff(sr, r); why != "" {
					return res, diverge("destination offset %d (%s) does not match source offset %d (%s): "+
						"the destination was written by someone else or the source log changed", r.Offset, writer(b), sr.Offset, why)
				}
				if en, ok := xl.Observe(sr.Offset, r.Offset); ok {
					res.entries = append(res.entries, en)
				}
				res.walked++
			}
			if srcIt.pending() {
				return res, diverge("destination batch %d..%d ends inside source batch ending at offset %d", b.BaseOffset(), b.LastOffset(), srcIt.cur.srcNext-1)
			}
			res.end = Entry{Src: srcIt.cur.srcNext, Dst: b.LastOffset() + 1}
			res.epoch = srcIt.cur.epoch
			if id, ok := ownID(b); ok {
				// LastOffsetDelta, not the record count: compaction on the
				// destination may have removed records of the batch.
				res.own[id] = kwire.NextSequence(b.BaseSequence(), b.LastOffsetDelta()+1)
			}
		}
	}
}

// recordDiff names the first difference between two records, or "".
func recordDiff(a, b kwire.Record) string {
	switch {
	case a.Timestamp != b.Timestamp:
		return fmt.Sprintf("timestamp %d != %d", a.Timestamp, b.Timestamp)
	case !sameBytes(a.Key, b.Key):
		return "key differs"
	case !sameBytes(a.Value, b.Value):
		return "value differs"
	case len(a.Headers) != len(b.Headers):
		return fmt.Sprintf("%d headers != %d", len(a.Headers), len(b.Headers))
	}
	for i := range a.Headers {
		if a.Headers[i].Key != b.Headers[i].Key || !sameBytes(a.Headers[i].Value, b.Headers[i].Value) {
			return fmt.Sprintf("header %d differs", i)
		}
	}
	return ""
}

// sameBytes compares byte slices keeping null and empty apart.
func sameBytes(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }

// sourceIter yields the source records the data path would mirror, in
// order, through the same buildItems filter.
type sourceIter struct {
	r     *partitionReader
	items []*item
	cur   *item
	recs  []kwire.Record
}

func (s *sourceIter) pending() bool { return len(s.recs) > 0 }

func (s *sourceIter) next(ctx context.Context) (kwire.Record, bool, error) {
	for len(s.recs) == 0 {
		for len(s.items) > 0 && len(s.recs) == 0 {
			s.cur, s.items = s.items[0], s.items[1:]
			if s.cur.skip() {
				continue
			}
			recs, err := s.cur.records()
			if err != nil {
				return kwire.Record{}, false, err
			}
			s.recs = recs
		}
		if len(s.recs) > 0 {
			break
		}
		fp, err := s.r.fetch(ctx)
		if err != nil {
			return kwire.Record{}, false, err
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, s.r.offset)
		if err != nil {
			return kwire.Record{}, false, err
		}
		if len(items) == 0 && need == 0 {
			return kwire.Record{}, false, nil // nothing more committed
		}
		if len(items) == 0 {
			s.r.maxBytes = growFetch(s.r.maxBytes, need)
		}
		s.items, s.r.offset = items, next
	}
	r := s.recs[0]
	s.recs = s.recs[1:]
	return r, true, nil
}

// maxWalks bounds the walks (resume, confirm, settle) an engine runs at
// once: a member taking over many partitions walks them a few at a time,
// on pooled connections, with their buffers charged to the memory budget.
const maxWalks = 8

// walkBufferBytes is what one walk's two readers fetch at once at first.
const walkBufferBytes = 2 * readerFetchBytes

// walkSlot waits for one of maxWalks walk slots and charges the walk's
// buffers to the memory budget (at most an eighth of it, so a small budget
// still lets walks run); done gives both back.
func (e *Engine) walkSlot(ctx context.Context) (done func(), err error) {
	select {
	case e.walks <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	charge := min(int64(walkBufferBytes), e.cfg.MemoryBudget/maxWalks)
	e.mu.Lock()
	e.inUse += charge
	e.mu.Unlock()
	return func() {
		e.mu.Lock()
		e.inUse -= charge
		e.kickFetchersLocked()
		e.mu.Unlock()
		<-e.walks
	}, nil
}

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
	if res[0].Err != 0 {
		kerr := &kwire.Error{Code: res[0].Err, Topic: r.topic, Partition: r.partition, Op: "fetch from " + r.cl.name}
		if res[0].Err == kwire.CodeOffsetOutOfRange {
			return kwire.FetchedPartition{}, &Divergence{
				Key:    Key{Topic: r.topic, Partition: r.partition},
				Reason: fmt.Sprintf("offset %d is out of range on the %s (log starts at %d)", r.offset, r.cl.name, res[0].LogStartOffset),
			}
		}
		return kwire.FetchedPartition{}, kerr
	}
	return res[0], nil
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
