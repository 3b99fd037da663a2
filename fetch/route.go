package fetch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Routing: which broker connection (fetch loop) serves each partition on
// both clusters, and what a partition waits for while its leader is
// unknown, its topic is gone or recreated, or the source truncated it.

// routeLoop finds the source and destination leaders of partitions that
// need routing and makes sure a fetch or produce loop runs for each broker.
func (e *Engine) routeLoop() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		case <-e.kickRt:
		}
		e.route()
	}
}

func (e *Engine) route() {
	e.mu.Lock()
	var needSrc, needDst []*partition
	for _, p := range e.parts {
		if !p.active() {
			continue
		}
		if p.srcLeader < 0 && !p.releasing() {
			needSrc = append(needSrc, p)
		}
		if p.dstLeader < 0 {
			needDst = append(needDst, p)
		}
	}
	e.mu.Unlock()
	if len(needSrc)+len(needDst) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for _, p := range needSrc {
		k := p.key()
		e.mu.Lock()
		src := e.sources[k.Mirror]
		e.mu.Unlock()
		if src == nil {
			continue
		}
		id, addr, epoch, err := src.cl.Leader(ctx, k.Topic, k.Partition, 0)
		if err == nil {
			err = e.checkTopicID(ctx, src.cl, p, "source")
		}
		if err == nil {
			err = e.checkSourceTruncation(ctx, src.cl, p, addr, epoch)
		}
		if e.routeFailed(p, "source", src.cl, err) {
			continue
		}
		e.mu.Lock()
		// A source replaced during the lookup (SetSource: new settings)
		// has no fetch loops any more: leave p unrouted for the next pass,
		// which looks it up in the new one. Routing it here would start a
		// loop that exits at once, and p would never be fetched again.
		if p.active() && p.srcLeader < 0 && e.sources[k.Mirror] == src {
			p.srcLeader, p.srcEpoch = id, epoch
			e.fetchersLocked(k.Mirror, src, id, addr, &k)
		}
		e.mu.Unlock()
	}
	for _, p := range needDst {
		k := p.key()
		id, addr, _, err := e.dest.Leader(ctx, k.Topic, k.Partition, 0)
		if err == nil {
			// Before any produce: never write into a topic someone
			// recreated under the mirror.
			err = e.checkTopicID(ctx, e.dest, p, "destination")
		}
		if e.routeFailed(p, "destination", e.dest, err) {
			continue
		}
		e.mu.Lock()
		if p.active() && p.dstLeader < 0 {
			p.dstLeader = id
			e.workerLocked(e.senders, id, addr, e.produceLoop)
		}
		e.mu.Unlock()
	}
}

// checkSourceTruncation runs before fetching from a (new) source leader:
// it asks the leader where the leader epoch of the last batch kmirror
// fetched ends in its log (OffsetForLeaderEpoch, KIP-320; design.md
// section 8). A clean leader change keeps every record up to the high
// watermark, and read_committed never fetches beyond it, so the epoch
// ends at or after the fetch offset. An end before it means the new
// leader lacks records kmirror read (an unclean leader election):
//
//   - records fetched but not yet written to the destination are dropped
//     from the queue and fetched again from the new leader: the clusters
//     still agree;
//   - records already mirrored that the source no longer has are a
//     divergence: the partition stops DIVERGED with the exact range (the
//     destination keeps them; mirroring on would give their source
//     offsets to other records).
func (e *Engine) checkSourceTruncation(ctx context.Context, cl *kafka.Cluster, p *partition, addr string, leaderEpoch int32) error {
	e.mu.Lock()
	fe, fo, k, start := p.fetchedEpoch, p.fetchOffset, p.key(), p.spec.StartOffset
	e.mu.Unlock()
	if fe < 0 || fo <= start {
		return nil // nothing fetched with a known epoch yet
	}
	conn, err := cl.Borrow(ctx, addr)
	if err != nil {
		return err
	}
	rctx, cancel := kafka.ExchangeCtx(ctx)
	end, err := conn.EpochEndOffset(rctx, k.Topic, k.Partition, leaderEpoch, fe)
	cancel()
	var kerr *kwire.Error
	if err != nil && !errors.As(err, &kerr) {
		conn.Close()
		return err
	}
	cl.GiveBack(addr, conn)
	if err != nil {
		return err
	}
	if end.EndOffset < 0 || end.EndOffset >= fo {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.fetchOffset != fo || !p.active() {
		return nil // restarted meanwhile: its next route checks again
	}
	cut := end.EndOffset
	keep := 0
	if cut >= p.pos.SourceOffset {
		for keep < len(p.queue) && p.queue[keep].srcNext <= cut {
			keep++
		}
		straddles := keep < len(p.queue) && p.queue[keep].srcFirst < cut
		inFlightLost := keep < p.inflightEnd()
		if !straddles && !inFlightLost {
			for _, it := range p.queue[keep:] {
				e.dequeueLocked(p, it)
			}
			p.queue = p.queue[:keep]
			p.fetchOffset, p.fetchedEpoch = cut, end.LeaderEpoch
			e.log.Warn("new source leader lacks records kmirror fetched but had not written (an unclean leader election on the source); "+
				"fetching again from it", zap.Stringer("partition", k), zap.Int32("leader_epoch", leaderEpoch),
				zap.Int64("from", cut), zap.Int64("to", fo-1))
			return nil
		}
	}
	hi := p.pos.SourceOffset - 1 // mirrored and lost
	if cut >= p.pos.SourceOffset && len(p.queue) > 0 {
		// In a batch being written, or one that straddles the cut.
		hi = p.queue[max(keep, p.inflightEnd()-1)].srcNext - 1
	}
	return &Divergence{Key: k, Reason: fmt.Sprintf("the source lost offsets %d..%d of %s after kmirror mirrored them: its new leader "+
		"(leader epoch %d) ends leader epoch %d at offset %d, before what was mirrored (an unclean leader election on the source). "+
		"The destination keeps those records; mirroring on would give their source offsets to other records. "+
		"To mirror the source as it is now: kmirror remove --mirror %s --topic %s, delete topic %s on the destination cluster, then add it again",
		cut, hi, k, leaderEpoch, fe, cut, k.Mirror, k.Topic, k.Topic)}
}

// topicGoneWait is how long a mirrored topic may be missing on either
// cluster before its partitions are FAILED with that reason: long enough
// for metadata to settle after a topic is created or a broker restarts.
const topicGoneWait = 20 * time.Second

// checkTopicID compares the topic ID in cl's metadata (just refreshed by
// leader) with the one the mirror recorded for that side.
func (e *Engine) checkTopicID(ctx context.Context, cl *kafka.Cluster, p *partition, side string) error {
	md, err := cl.Metadata(ctx, time.Minute)
	if err != nil {
		return err
	}
	e.mu.Lock()
	spec := p.spec
	e.mu.Unlock()
	want := spec.SourceTopicID
	if side == "destination" {
		want = spec.DestTopicID
	}
	if id := md.TopicIDs[spec.Key.Topic]; want != "" && id != "" && id != want {
		return &Divergence{Key: spec.Key, Reason: topicRecreatedReason(spec.Key, side, id, want)}
	}
	return nil
}

// Reasons routeFailed shows while a side's leader cannot be looked up.
const (
	sourceLeaderUnknown      = "source leader unknown: "
	destinationLeaderUnknown = "destination leader unknown: "
)

// routeFailed handles a failed leader lookup of p on one side (nil err:
// none): a recreated topic stops p DIVERGED; a topic missing for longer
// than topicGoneWait makes p FAILED with that reason (retried with
// backoff, so it picks up a topic that comes back); other errors are
// retried at the next route. It reports whether the lookup failed.
func (e *Engine) routeFailed(p *partition, side string, cl *kafka.Cluster, err error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	missing := &p.srcMissing
	if side == "destination" {
		missing = &p.dstMissing
	}
	if err == nil {
		*missing = time.Time{}
		if side == "source" && strings.HasPrefix(p.fetchErr, sourceLeaderUnknown) {
			p.fetchErr = ""
		}
		if side == "destination" && strings.HasPrefix(p.produceErr, destinationLeaderUnknown) {
			p.produceErr = ""
		}
		return false
	}
	if !p.active() {
		return true
	}
	var dv *Divergence
	var kerr *kwire.Error
	switch {
	case errors.As(err, &dv):
		e.divergeLocked(p, dv.Reason)
	case kafka.SecurityFailure(err) && !p.releasing():
		e.failLocked(p, err)
	case errors.As(err, &kerr) && kerr.Code == kwire.CodeUnknownTopicOrPartition:
		if missing.IsZero() {
			*missing = time.Now()
		}
		reason := topicGoneReason(p.key(), side, cl.Name)
		if time.Since(*missing) >= topicGoneWait && !p.releasing() {
			*missing = time.Time{}
			e.failLocked(p, errors.New(reason))
			return true
		}
		p.fetchErr = fmt.Sprintf("%s topic %s not found for %s", side, p.key().Topic, time.Since(*missing).Round(time.Second))
	default:
		e.log.Debug(side+" leader unknown", zap.Stringer("partition", p.key()), zap.Error(err))
		if side == "source" {
			// Shown instead of the last fetch error, which may name a
			// broker that is gone.
			p.fetchErr = sourceLeaderUnknown + err.Error()
		} else {
			p.produceErr = destinationLeaderUnknown + err.Error()
		}
	}
	return true
}

// fetchersLocked wakes the fetch loops of source broker id, starting those
// missing (one per fetch connection, source.fetchConns). routed names the
// partition just routed to the broker: only its loop's long poll ends
// (a new loop starts with a short one), so a partition whose leader flaps
// does not reopen every idle session of the broker (issue 20). nil: the
// partitions were spread anew, and every loop's long poll ends.
func (e *Engine) fetchersLocked(mirror string, src *source, id int32, addr string, routed *Key) {
	n := src.fetchConns(id)
	for slot := range n {
		key := fetcherKey{id, slot}
		w := src.fetchers[key]
		if w == nil || w.addr != addr {
			w = &worker{broker: id, slot: slot, addr: addr, kick: make(chan struct{}, 1), routed: make(chan struct{}, 1)}
			src.fetchers[key] = w
			e.goLoop(func() { e.fetchLoop(mirror, src, w) })
		}
		kick(w.kick)
		if routed == nil || fetchSlot(*routed, n) == slot {
			kick(w.routed)
		}
	}
}

// workerLocked wakes the loop of broker id in pool, starting one (run) if
// there is none for that address; a loop whose broker moved to another
// address sees it was replaced and exits.
func (e *Engine) workerLocked(pool map[int32]*worker, id int32, addr string, run func(*worker)) {
	w := pool[id]
	if w == nil || w.addr != addr {
		w = &worker{broker: id, addr: addr, kick: make(chan struct{}, 1)}
		pool[id] = w
		e.goLoop(func() { run(w) })
	}
	kick(w.kick)
}
