package fetch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
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
	cl       *cluster
	fetchers map[int32]*worker
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
	dest := newCluster("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationTLS)
	return &Engine{
		cfg:       cfg,
		ctl:       ctl,
		log:       log.Named("fetch"),
		dest:      dest,
		destAdmin: NewAdmin("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationTLS),
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
	if s, ok := e.sources[mirror]; ok && slices.Equal(s.cl.bootstrap, src.Bootstrap) {
		return
	}
	e.sources[mirror] = &source{
		cl:       newCluster(fmt.Sprintf("source cluster of mirror %s", mirror), src.Bootstrap, e.cfg.ClientID, src.TLS),
		fetchers: map[int32]*worker{},
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
		if ok && !p.draining && p.spec.Generation != s.Generation && (p.renewing || !sameProducer(p.spec.Producer, s.Producer)) {
			// A new producer identity (a renewal through raft): resume
			// under it with a walk.
			e.log.Info("partition has a new producer identity; resuming", zap.Stringer("partition", k))
			p.spec, p.renewing = s, false
			p.spec.Handoff = nil
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

// Drop stops a partition at once, without draining its queue or writing a
// checkpoint: its lease moved to another member, which resumes from the
// last checkpoint with a walk. It returns once no produce of the partition
// is in flight.
func (e *Engine) Drop(ctx context.Context, k Key) error {
	e.mu.Lock()
	p, ok := e.parts[k]
	if !ok {
		e.mu.Unlock()
		return nil
	}
	p.gen++
	e.dropQueueLocked(p)
	p.state, p.draining = Stopped, true
	e.mu.Unlock()
	err := e.waitIdle(ctx, p, -1)
	e.mu.Lock()
	if e.parts[k] == p {
		delete(e.parts, k)
	}
	e.mu.Unlock()
	return err
}

// startLocked launches the resume of p after delay. Called with e.mu held.
func (e *Engine) startLocked(p *partition, delay time.Duration) {
	p.gen++
	gen := p.gen
	e.goLoop(func() { e.runStart(p, gen, delay) })
}

func (e *Engine) runStart(p *partition, gen int, delay time.Duration) {
	if delay > 0 {
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	err := e.resume(e.ctx, p, gen)
	if err == nil || e.ctx.Err() != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.gen != gen {
		return
	}
	var dv *Divergence
	var behind *sourceBehind
	if errors.As(err, &dv) || (errors.As(err, &behind) && p.failures >= behindRetries) {
		e.divergeLocked(p, err.Error())
		return
	}
	e.failLocked(p, err)
}

// failLocked puts p in FAILED and schedules a restart with backoff.
func (e *Engine) failLocked(p *partition, err error) {
	p.failures++
	backoff := e.cfg.RetryBackoff << min(p.failures, 10)
	if backoff > e.cfg.MaxRetryBackoff {
		backoff = e.cfg.MaxRetryBackoff
	}
	e.setStateLocked(p, Failed, err.Error())
	e.dropQueueLocked(p)
	if p.draining {
		// Being released: Release settles its position; no restart.
		e.log.Warn("partition failed while draining", zap.Stringer("partition", p.key()), zap.Error(err))
		return
	}
	e.log.Warn("partition failed; retrying", zap.Stringer("partition", p.key()),
		zap.Duration("backoff", backoff), zap.Error(err))
	e.startLocked(p, backoff)
}

func sameProducer(a, b *ProducerID) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// handBackLocked stops p after the destination refused its producer
// identity and asks the control plane to renew it; Assign restarts p once
// the new generation arrives.
func (e *Engine) handBackLocked(p *partition, reason string) {
	e.setStateLocked(p, Failed, reason+"; waiting for the raft leader to renew the producer epoch")
	e.dropQueueLocked(p)
	p.gen++ // no restart before the renewal
	p.renewing = true
	k, gen := p.key(), p.spec.Generation
	go e.ctl.RenewProducer(k, gen, reason)
}

// divergeLocked stops p for good: it needs an operator.
func (e *Engine) divergeLocked(p *partition, reason string) {
	e.divergences++
	e.setStateLocked(p, Diverged, reason)
	e.dropQueueLocked(p)
	p.gen++
	e.log.Error("partition diverged", zap.Stringer("partition", p.key()), zap.String("reason", reason))
}

func (e *Engine) dropQueueLocked(p *partition) {
	e.inUse -= p.queued
	p.queue, p.queued = nil, 0
	p.confirming = false
	if p.draining && p.released != nil && !p.inflight {
		closeOnce(p)
	}
}

func (e *Engine) setStateLocked(p *partition, s State, reason string) {
	if p.state == s && p.reason == reason {
		return
	}
	p.state, p.reason = s, reason
	e.reports = append(e.reports, report{p.key(), s, reason})
	kick(e.kickRep)
}

// report is a state change waiting to be told to the control plane.
type report struct {
	key    Key
	state  State
	reason string
}

// reportLoop tells the control plane about state changes one at a time,
// in the order they happened, outside the engine lock.
func (e *Engine) reportLoop() {
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-e.kickRep:
		}
		for {
			e.mu.Lock()
			if len(e.reports) == 0 {
				e.mu.Unlock()
				break
			}
			r := e.reports[0]
			e.reports = e.reports[1:]
			e.mu.Unlock()
			e.ctl.Report(r.key, r.state, r.reason)
		}
	}
}

func closeOnce(p *partition) {
	select {
	case <-p.released:
	default:
		close(p.released)
	}
}

// Release stops mirroring a partition gracefully: no more fetching, every
// fetched batch produced, a final checkpoint written. It returns the last
// mirrored position. A partition that was not mirroring cleanly (starting,
// failed, diverged, or failed while draining) may have had a batch land
// whose answer was lost: its position is settled by walking the
// destination instead. The partition is dropped from the engine even when
// Release fails; a later lease resumes it from its checkpoint.
func (e *Engine) Release(ctx context.Context, k Key) (Position, error) {
	pos, _, err := e.release(ctx, k)
	return pos, err
}

// HandOff releases a partition for a graceful handoff and returns its
// exact position, from which the next owner continues without a walk.
// It returns nil when the drain was not clean (the partition was not
// mirroring): the next owner then resumes with the verified walk.
func (e *Engine) HandOff(ctx context.Context, k Key) (*Handoff, error) {
	e.mu.Lock()
	p, ok := e.parts[k]
	var id ProducerID
	if ok {
		id = p.producer
	}
	e.mu.Unlock()
	if !ok {
		return nil, nil // nothing runs here: the next owner walks
	}
	pos, settled, err := e.release(ctx, k)
	if err != nil || settled {
		return nil, err
	}
	e.mu.Lock()
	seq := p.nextSeq
	e.mu.Unlock()
	return &Handoff{Position: pos, Sequence: seq, Producer: id}, nil
}

// Stop ends the mirroring of a partition for good (remove, failover) and
// returns its exact last mirrored position: Release, then, unless Release
// already settled the position by a walk, a walk from the final checkpoint
// to the end of the destination leader's log (Settle). A late copy of one of
// kmirror's own batches that landed after the last acknowledged one is thus
// stepped over and counted rather than recorded as mirrored data, and a
// consumer that fails over at the recorded position reads no record twice.
// A partition this engine does not hold is settled the same way.
func (e *Engine) Stop(ctx context.Context, spec Spec) (Position, error) {
	pos, settled, err := e.release(ctx, spec.Key)
	if errors.Is(err, ErrUnknownPartition) || (err == nil && !settled) {
		return e.Settle(ctx, spec)
	}
	return pos, err
}

// release is Release; settled reports that the position came from a walk.
func (e *Engine) release(ctx context.Context, k Key) (pos Position, settled bool, err error) {
	e.mu.Lock()
	p, ok := e.parts[k]
	if !ok {
		e.mu.Unlock()
		return Position{}, false, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	if p.released == nil {
		p.released = make(chan struct{})
	}
	p.draining = true
	if p.active() {
		p.state = Draining
		if p.drained() {
			closeOnce(p)
		}
	} else {
		p.gen++ // stop a pending restart
		closeOnce(p)
	}
	done := p.released
	e.mu.Unlock()
	kick(e.kickRt)
	select {
	case <-done:
	case <-ctx.Done():
		return Position{}, false, fmt.Errorf("drain %s: %w", k, ctx.Err())
	}
	defer func() {
		e.mu.Lock()
		if e.parts[k] == p {
			delete(e.parts, k)
		}
		e.mu.Unlock()
	}()
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	e.mu.Lock()
	clean := p.state == Draining
	pos, spec, resumed := p.pos, p.spec, p.resumed
	up := e.updateLocked(p)
	e.mu.Unlock()
	if !clean {
		if err := e.waitIdle(ctx, p, -1); err != nil {
			return Position{}, false, err
		}
		if resumed { // its acknowledged progress first: the walk starts there
			if err := e.store.write(ctx, []update{up}); err != nil {
				return Position{}, false, fmt.Errorf("checkpoint of %s: %w", k, err)
			}
		}
		pos, err := e.settle(ctx, spec)
		return pos, true, err
	}
	if err := e.store.write(ctx, []update{up}); err != nil {
		return Position{}, false, fmt.Errorf("final checkpoint of %s: %w", k, err)
	}
	return pos, false, nil
}

// Settle returns the exact mirrored position of a partition this engine
// does not mirror now: from its last checkpoint (or start offset) it walks
// the source and the destination up to the destination's high watermark,
// so a batch that landed after the checkpoint is counted, and records the
// result as a checkpoint. A walk that finds a divergence falls back to the
// checkpoint, which is then the last position known to match.
func (e *Engine) Settle(ctx context.Context, spec Spec) (Position, error) {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	return e.settle(ctx, spec)
}

func (e *Engine) settle(ctx context.Context, spec Spec) (Position, error) {
	k := spec.Key
	e.mu.Lock()
	src := e.sources[k.Mirror]
	e.mu.Unlock()
	if err := e.store.catchUp(ctx); err != nil {
		return Position{}, fmt.Errorf("read checkpoints: %w", err)
	}
	cp, hasCP, entries := e.store.load(k)
	start := Entry{Src: spec.StartOffset}
	pid := ProducerID{ID: -1}
	if hasCP {
		start = Entry{Src: cp.Src, Dst: cp.Dst}
		pid = ProducerID{ID: cp.PID, Epoch: cp.Epoch}
	}
	known := Position{SourceOffset: start.Src, DestinationOffset: start.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
	if src == nil {
		return known, fmt.Errorf("mirror %s has no source connection settings", k.Mirror)
	}
	var xl Translation
	xl.Restore(entries, start)
	w, err := e.walk(ctx, src.cl, k, start, pid, ownSeqs{pid: cp.Seq}, &xl)
	var dv *Divergence
	if errors.As(err, &dv) {
		e.log.Warn("settling a diverged partition at its last checkpoint", zap.Stringer("partition", k), zap.Error(err))
		return known, nil
	}
	if err != nil {
		return Position{}, fmt.Errorf("settle position of %s: %w", k, err)
	}
	for _, d := range w.duplicates {
		e.logDuplicate(k, d)
	}
	up := update{key: k, entries: w.entries, cp: checkpoint{Src: w.end.Src, Dst: w.end.Dst, Seq: w.nextSeq,
		PID: pid.ID, Epoch: pid.Epoch, LeaderEpoch: w.epoch}}
	if err := e.store.write(ctx, []update{up}); err != nil {
		return Position{}, fmt.Errorf("checkpoint of %s: %w", k, err)
	}
	return Position{SourceOffset: w.end.Src, DestinationOffset: w.end.Dst, SourceLeaderEpoch: w.epoch}, nil
}

// RecordStopped writes a stopped partition's last mirrored position to the
// state topic, where the other side can read it with plain Kafka.
func (e *Engine) RecordStopped(ctx context.Context, k Key, rec any) error {
	return e.store.writeStopped(ctx, e.cfg.StateTopic, k, rec)
}

// updateLocked snapshots p's progress for a checkpoint write and clears
// its unsaved state.
func (e *Engine) updateLocked(p *partition) update {
	u := update{key: p.key(), entries: p.unsaved, cp: checkpoint{
		Src: p.pos.SourceOffset, Dst: p.pos.DestinationOffset, Seq: p.nextSeq,
		PID: p.producer.ID, Epoch: p.producer.Epoch, LeaderEpoch: p.pos.SourceLeaderEpoch,
	}}
	p.unsaved, p.dirty = nil, false
	return u
}

// Statuses returns every held partition's progress, sorted.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	out := make([]Status, 0, len(e.parts))
	for _, p := range e.parts {
		out = append(out, p.status())
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key.Less(out[j].Key) })
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
func (e *Engine) Translate(k Key, sourceOffset int64) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.active() {
		return 0, false
	}
	return p.xl.Translate(sourceOffset)
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
		if err != nil {
			e.log.Debug("source leader unknown", zap.Stringer("partition", k), zap.Error(err))
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
		if err != nil {
			e.log.Debug("destination leader unknown", zap.Stringer("partition", k), zap.Error(err))
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
	if err != nil {
		e.log.Warn("checkpoint write failed; will retry", zap.Error(err))
		e.mu.Lock()
		for _, u := range ups {
			if p, ok := e.parts[u.key]; ok {
				p.unsaved = append(u.entries, p.unsaved...)
				p.dirty = true
			}
		}
		e.mu.Unlock()
	}
}
