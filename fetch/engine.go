package fetch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// ErrUnknownPartition is returned for a partition the engine does not hold.
var ErrUnknownPartition = errors.New("partition not leased to this member")

// Engine runs the data path of one member: every partition leased to it.
type Engine struct {
	cfg       Config
	ctl       Control
	log       *zap.Logger
	dest      *cluster
	destAdmin *Admin
	store     *offsetStore

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kickRt chan struct{}
	// walks holds a slot per running walk (walkSlot).
	walks chan struct{}

	mu      sync.Mutex
	sources map[string]*source
	parts   map[Key]*partition
	senders map[int32]*worker
	inUse   int64 // bytes queued, charged to cfg.MemoryBudget
	reports []report
	// divergences counts partitions stopped as DIVERGED since start.
	divergences int64
	// ckptMu makes taking and writing a checkpoint one step, so an older
	// snapshot never lands after a newer one.
	ckptMu  sync.Mutex
	kickRep chan struct{}
}

// source is one mirror's source cluster and its fetch loops by broker.
type source struct {
	cl          *cluster
	securityKey string // Source.SecurityKey the cluster was made with
	fetchers    map[int32]*worker
}

// worker is a fetch loop (per source broker) or a produce loop (per
// destination broker).
type worker struct {
	broker int32
	addr   string
	kick   chan struct{}
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// New returns an engine; call Start before Assign.
func New(cfg Config, ctl Control, log *zap.Logger) *Engine {
	cfg.Defaults()
	dest := newCluster("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationSecurity)
	return &Engine{
		cfg:       cfg,
		ctl:       ctl,
		log:       log.Named("fetch"),
		dest:      dest,
		destAdmin: NewAdmin("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationSecurity),
		store:     newOffsetStore(dest, cfg.OffsetsTopic),
		kickRt:    make(chan struct{}, 1),
		walks:     make(chan struct{}, maxWalks),
		kickRep:   make(chan struct{}, 1),
		sources:   map[string]*source{},
		parts:     map[Key]*partition{},
		senders:   map[int32]*worker{},
	}
}

// Start creates the internal topics if needed, loads checkpoints and starts
// the background loops. The loops stop when ctx is cancelled or on Close.
func (e *Engine) Start(ctx context.Context) error {
	for _, t := range []string{e.cfg.OffsetsTopic, e.cfg.StateTopic} {
		if err := e.ensureInternalTopic(ctx, t); err != nil {
			return err
		}
	}
	if err := e.store.catchUp(ctx); err != nil {
		return fmt.Errorf("load checkpoints from %s: %w", e.cfg.OffsetsTopic, err)
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.goLoop(e.routeLoop)
	e.goLoop(func() { e.tick(e.cfg.Checkpoint, e.checkpoint) })
	e.goLoop(e.reportLoop)
	e.goLoop(func() { e.tick(idleCheck, e.checkIdle) })
	return nil
}

// tick runs f every d until the engine stops.
func (e *Engine) tick(d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		f()
	}
}

func (e *Engine) ensureInternalTopic(ctx context.Context, topic string) error {
	_, err := e.destAdmin.Partitions(ctx, topic)
	if errors.Is(err, ErrTopicNotFound) {
		err = e.destAdmin.CreateTopic(ctx, topic, 1, e.cfg.InternalRF, map[string]string{
			"cleanup.policy": "compact", "min.compaction.lag.ms": "60000",
		})
		var kerr *kwire.Error
		if err != nil && !(errors.As(err, &kerr) && kerr.Code == kwire.CodeTopicAlreadyExists) {
			return fmt.Errorf("create internal topic %s: %w", topic, err)
		}
		return nil
	}
	return err
}

func (e *Engine) goLoop(f func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		f()
	}()
}

// SetSource tells the engine how to reach a mirror's source cluster.
func (e *Engine) SetSource(mirror string, src Source) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.sources[mirror]; ok && slices.Equal(s.cl.bootstrap, src.Bootstrap) && s.securityKey == src.SecurityKey {
		return
	} else if ok {
		// Replaced: its fetch loops see it and exit; its metadata and
		// pooled connections go now; the mirror's partitions are routed
		// anew, to fetch loops of the new source.
		for _, w := range s.fetchers {
			kick(w.kick)
		}
		go s.cl.close()
		for k, p := range e.parts {
			if k.Mirror == mirror {
				p.srcLeader = -1
			}
		}
		defer kick(e.kickRt)
	}
	e.sources[mirror] = &source{
		cl:          newCluster(fmt.Sprintf("source cluster of mirror %s", mirror), src.Bootstrap, e.cfg.ClientID, src.Security),
		securityKey: src.SecurityKey,
		fetchers:    map[int32]*worker{},
	}
}

// RetainSources forgets the source clusters of mirrors not in keep that no
// held partition uses any more (a deleted mirror): their fetch loops see
// it and exit, and their connections close.
func (e *Engine) RetainSources(keep map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	used := map[string]bool{}
	for k := range e.parts {
		used[k.Mirror] = true
	}
	for name, s := range e.sources {
		if !keep[name] && !used[name] {
			delete(e.sources, name)
			for _, w := range s.fetchers {
				kick(w.kick)
			}
			go s.cl.close()
		}
	}
}

// Assign starts the given partitions that the engine does not hold yet
// (each resumes from its checkpoint, or continues from its handoff) and
// updates the generation of held ones; a held partition whose producer
// identity changed resumes under the new one. Partitions not named are
// left alone: the caller releases (Release, HandOff, Stop) or drops (Drop)
// them.
func (e *Engine) Assign(specs []Spec) {
	e.mu.Lock()
	defer e.mu.Unlock()
	want := make(map[Key]Spec, len(specs))
	for _, s := range specs {
		want[s.Key] = s
	}
	for k, s := range want {
		p, ok := e.parts[k]
		if s.Diverged != "" {
			e.parkDivergedLocked(k, p, s)
			continue
		}
		if ok && !p.draining && p.spec.Generation != s.Generation && (p.state == Diverged || p.state == Failed || s.AcceptGap) {
			// An operator resumed it (kmirror resume): start over with a
			// walk now, also out of a FAILED backoff, so a gap permission
			// is used by this start and by no later one.
			e.log.Info("partition resumed by the operator", zap.Stringer("partition", k), zap.Bool("accept_gap", s.AcceptGap))
			p.spec, p.renewing = s, false
			e.dropQueueLocked(p)
			p.state, p.failures = Starting, 0
			e.startLocked(p, 0)
			continue
		}
		if ok && !p.draining && p.spec.Generation != s.Generation && (p.renewing || !sameProducer(p.spec.Producer, s.Producer)) {
			// A new producer identity (a renewal through raft): resume
			// under it with a walk.
			e.log.Info("partition has a new producer identity; resuming", zap.Stringer("partition", k))
			p.spec, p.renewing = s, false
			e.dropQueueLocked(p)
			p.state = Starting
			e.startLocked(p, 0)
			continue
		}
		if ok {
			p.spec.Generation = s.Generation
			continue
		}
		p = &partition{spec: s, state: Starting, srcLeader: -1, dstLeader: -1, srcEnd: -1, idleSeen: -1}
		e.parts[k] = p
		e.startLocked(p, 0)
	}
}

// parkDivergedLocked applies a control-plane DIVERGED: a running partition
// stops (its position stays for describe); one not held is held stopped at
// its last checkpoint.
func (e *Engine) parkDivergedLocked(k Key, p *partition, s Spec) {
	if p != nil {
		p.spec.Generation = s.Generation
		if p.state != Diverged && !p.draining {
			e.divergeLocked(p, s.Diverged)
		}
		return
	}
	p = &partition{spec: s, state: Diverged, reason: s.Diverged, srcLeader: -1, dstLeader: -1, srcEnd: -1, idleSeen: -1}
	if cp, ok := e.store.checkpointOf(k); ok {
		p.pos = Position{SourceOffset: cp.Src, DestinationOffset: cp.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
	} else {
		p.pos = Position{SourceOffset: s.StartOffset}
	}
	e.parts[k] = p
}

// Checkpointed returns the last persisted position of a partition as
// found in the offsets topic (whichever member wrote it), after reading
// what was appended since the last read. ok is false without a checkpoint.
func (e *Engine) Checkpointed(ctx context.Context, k Key) (pos Position, ok bool, err error) {
	if err := e.store.catchUp(ctx); err != nil {
		return Position{}, false, err
	}
	cp, ok := e.store.checkpointOf(k)
	return Position{SourceOffset: cp.Src, DestinationOffset: cp.Dst, SourceLeaderEpoch: cp.LeaderEpoch}, ok, nil
}

// ForgetTopic deletes (tombstones) every checkpoint and translation
// segment of a mirror's topic in the offsets topic: the topic was removed
// and is added again, and must start over, not resume where the earlier
// mirroring stopped.
func (e *Engine) ForgetTopic(ctx context.Context, mirror, topic string) error {
	if err := e.store.catchUp(ctx); err != nil {
		return err
	}
	return e.store.forget(ctx, mirror, topic)
}

// Held lists the partitions the engine holds.
func (e *Engine) Held() []Key {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Key, 0, len(e.parts))
	for k := range e.parts {
		out = append(out, k)
	}
	return out
}

// updateLocked snapshots p's progress for a checkpoint write and clears
// its unsaved state.
func (e *Engine) updateLocked(p *partition) update {
	segs, dropped := p.xl.takeUnsaved()
	u := update{key: p.key(), segs: segs, dropped: dropped, cp: checkpoint{
		Src: p.pos.SourceOffset, Dst: p.pos.DestinationOffset, Seq: p.nextSeq,
		PID: p.producer.ID, Epoch: p.producer.Epoch, LeaderEpoch: p.pos.SourceLeaderEpoch,
	}}
	p.dirty = false
	return u
}

// Statuses returns every held partition's progress, sorted.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	out := make([]Status, 0, len(e.parts))
	for k, p := range e.parts {
		st := p.status()
		if !p.resumed {
			// Not resumed yet (starting, or failed or diverged in its
			// first resume): the position is the checkpoint, not the
			// zero value; else unknown (-1), but for a partition held
			// DIVERGED by the control plane, which keeps its start offset.
			if cp, ok := e.store.checkpointOf(k); ok {
				st.Position = Position{SourceOffset: cp.Src, DestinationOffset: cp.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
			} else if p.state != Diverged {
				st.Position = Position{SourceOffset: -1, DestinationOffset: -1}
			}
		}
		out = append(out, st)
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key.Less(out[j].Key) })
	return out
}

// FetchedBytes returns, per mirror, the record bytes fetched from its
// source cluster since the mirror's source was set on this member (the
// data path and the resume walks).
func (e *Engine) FetchedBytes() map[string]int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int64, len(e.sources))
	for name, src := range e.sources {
		out[name] = src.cl.fetchedBytes.Load()
	}
	return out
}

// Divergences counts the partitions this engine stopped as DIVERGED since
// it started.
func (e *Engine) Divergences() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.divergences
}

// Translate maps a source offset to the destination offset of a held
// partition (design.md section 5).
//
// It fails with ErrUnknownPartition when the engine does not mirror the
// partition right now, with a *BeforeStartError for an offset below where
// mirroring started (records the mirror never copied: a consumer moving
// over there would skip them), and with ErrNotMirroredYet beyond the
// mirrored position.
func (e *Engine) Translate(k Key, sourceOffset int64) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.active() {
		return 0, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	if sourceOffset < p.spec.StartOffset {
		return 0, &BeforeStartError{Key: k, Offset: sourceOffset, Start: p.spec.StartOffset}
	}
	d, ok := p.xl.Translate(sourceOffset)
	if !ok {
		return 0, fmt.Errorf("%w: %s offset %d (mirrored up to %d)", ErrNotMirroredYet, k, sourceOffset, p.pos.SourceOffset)
	}
	return d, nil
}

// TranslateCommitted maps a group's committed source offset to the
// destination offset to commit for it, never past what has been mirrored:
// an offset beyond the mirrored position maps to the destination end
// (every record the group has not read yet that is mirrored is after it),
// and capped reports that. Errors are Translate's, except
// ErrNotMirroredYet.
func (e *Engine) TranslateCommitted(k Key, sourceOffset int64) (d int64, capped bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.active() {
		return 0, false, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	return translateCommitted(&p.xl, k, p.spec.StartOffset, sourceOffset)
}

func translateCommitted(xl *Translation, k Key, start, o int64) (int64, bool, error) {
	if o < start {
		return 0, false, &BeforeStartError{Key: k, Offset: o, Start: start}
	}
	if end := xl.End(); o > end.Src {
		return end.Dst, true, nil
	}
	d, _ := xl.Translate(o)
	return d, false, nil
}

// ErrNotMirroredYet: the source offset lies beyond what has been mirrored.
var ErrNotMirroredYet = errors.New("offset not mirrored yet")

// BeforeStartError: the source offset lies below the partition's start
// offset, resolved when the topic was added (--start-from latest, or the
// log start of the source then).
type BeforeStartError struct {
	Key           Key
	Offset, Start int64
}

func (e *BeforeStartError) Error() string {
	return fmt.Sprintf("%s offset %d is before where mirroring started (%d): source records %d..%d were never mirrored, "+
		"so a consumer moving over from offset %d would skip them; it continues without a skip only from %d on",
		e.Key, e.Offset, e.Start, e.Offset, e.Start-1, e.Offset, e.Start)
}

// Close drains every partition (bounded by ctx), writes final checkpoints
// and stops all loops.
func (e *Engine) Close(ctx context.Context) error {
	if e.cancel == nil {
		return nil
	}
	e.mu.Lock()
	keys := make([]Key, 0, len(e.parts))
	for k := range e.parts {
		keys = append(keys, k)
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Add(1)
		go func(i int, k Key) {
			defer wg.Done()
			_, errs[i] = e.Release(ctx, k)
		}(i, k)
	}
	wg.Wait()
	e.cancel()
	e.wg.Wait()
	e.mu.Lock()
	for _, s := range e.sources {
		s.cl.close()
	}
	e.mu.Unlock()
	e.dest.close()
	e.destAdmin.Close()
	e.store.close()
	return errors.Join(errs...)
}

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
		if p.srcLeader < 0 && !p.draining {
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
		id, addr, epoch, err := src.cl.leader(ctx, k.Topic, k.Partition, 0)
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
		if p.active() && p.srcLeader < 0 {
			p.srcLeader, p.srcEpoch = id, epoch
			e.workerLocked(src.fetchers, id, addr, func(w *worker) { e.fetchLoop(k.Mirror, src, w) })
		}
		e.mu.Unlock()
	}
	for _, p := range needDst {
		k := p.key()
		id, addr, _, err := e.dest.leader(ctx, k.Topic, k.Partition, 0)
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
func (e *Engine) checkSourceTruncation(ctx context.Context, cl *cluster, p *partition, addr string, leaderEpoch int32) error {
	e.mu.Lock()
	fe, fo, k, start := p.fetchedEpoch, p.fetchOffset, p.key(), p.spec.StartOffset
	e.mu.Unlock()
	if fe < 0 || fo <= start {
		return nil // nothing fetched with a known epoch yet
	}
	conn, err := cl.borrow(ctx, addr)
	if err != nil {
		return err
	}
	rctx, cancel := exchangeCtx(ctx)
	end, err := conn.EpochEndOffset(rctx, k.Topic, k.Partition, leaderEpoch, fe)
	cancel()
	var kerr *kwire.Error
	if err != nil && !errors.As(err, &kerr) {
		conn.Close()
		return err
	}
	cl.giveBack(addr, conn)
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
	if cut >= p.pos.SourceOffset {
		keep := 0
		for keep < len(p.queue) && p.queue[keep].srcNext <= cut {
			keep++
		}
		straddles := keep < len(p.queue) && p.queue[keep].srcFirst < cut
		inFlightLost := p.inflight && keep == 0 && len(p.queue) > 0
		if !straddles && !inFlightLost {
			for _, it := range p.queue[keep:] {
				p.queued -= it.size
				e.inUse -= it.size
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
		hi = p.queue[0].srcNext - 1 // in a batch being written, or one that straddles the cut
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
func (e *Engine) checkTopicID(ctx context.Context, cl *cluster, p *partition, side string) error {
	md, err := cl.metadata(ctx, time.Minute)
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
func (e *Engine) routeFailed(p *partition, side string, cl *cluster, err error) bool {
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
	case SecurityFailure(err) && !p.draining:
		e.failLocked(p, err)
	case errors.As(err, &kerr) && kerr.Code == kwire.CodeUnknownTopicOrPartition:
		if missing.IsZero() {
			*missing = time.Now()
		}
		reason := topicGoneReason(p.key(), side, cl.name)
		if time.Since(*missing) >= topicGoneWait && !p.draining {
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

// checkpoint persists progress and new translation breakpoints of every
// partition that moved (run every cfg.Checkpoint).
func (e *Engine) checkpoint() {
	e.ckptMu.Lock()
	e.mu.Lock()
	var ups []update
	for _, p := range e.parts {
		if p.dirty && p.active() {
			ups = append(ups, e.updateLocked(p))
		}
	}
	e.mu.Unlock()
	if len(ups) == 0 {
		e.ckptMu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	err := e.store.write(ctx, ups)
	cancel()
	e.ckptMu.Unlock()
	var werr *WriteError
	if err != nil && !errors.As(err, &werr) {
		werr = &WriteError{Failed: map[Key]bool{}, Err: err}
		for _, u := range ups {
			werr.Failed[u.key] = true
		}
	}
	if werr != nil {
		e.log.Warn("checkpoint write failed; will retry", zap.Int("partitions", len(werr.Failed)), zap.Error(werr.Err))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, u := range ups {
		p, ok := e.parts[u.key]
		if !ok {
			continue
		}
		if werr != nil && werr.Failed[u.key] {
			// Only this partition waits for the next round; the others'
			// checkpoints are written.
			p.xl.requeue(u.segs, u.dropped)
			p.dirty = true
			p.checkpointErr = "checkpoint not written (retrying every checkpoint_interval): " + werr.Err.Error()
		} else {
			p.checkpointErr = ""
		}
	}
}
