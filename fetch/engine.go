package fetch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ErrUnknownPartition is returned for a partition the engine does not hold.
var ErrUnknownPartition = errors.New("partition not leased to this member")

// Engine runs the data path of one member: every partition leased to it.
type Engine struct {
	cfg       Config
	ctl       Control
	log       *zap.Logger
	dest      *kafka.Cluster
	destAdmin *kafka.Admin
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
	// heldVersion grows whenever parts gains or loses a partition
	// (HeldVersioned).
	heldVersion uint64
	senders     map[int32]*worker
	inUse       int64 // bytes queued, charged to cfg.MemoryBudget
	reports     []report
	// divergences counts partitions stopped as DIVERGED since start.
	divergences int64
	// throttled is the produce throttle time destination brokers asked
	// for, per broker address (kmirror_destination_throttle_seconds_total).
	throttled map[string]time.Duration
	// ckptMu makes taking and writing a checkpoint one step, so an older
	// snapshot never lands after a newer one.
	ckptMu  sync.Mutex
	kickRep chan struct{}
}

// source is one mirror's source cluster and its fetch loops by broker.
type source struct {
	cl          *kafka.Cluster
	securityKey string // Source.SecurityKey the cluster was made with
	clientID    string // the client.id it uses
	fetchers    map[fetcherKey]*worker
	// conns is Source.FetchConnections (0: measured); measured is the
	// count sized from each broker's round trip (fetchConnsFor).
	conns    int
	measured map[int32]int
}

// fetcherKey names one of a source broker's fetch loops.
type fetcherKey struct {
	broker int32
	slot   int
}

// fetchConns is how many fetch loops run for a source broker.
func (s *source) fetchConns(broker int32) int {
	if s.conns > 0 {
		return s.conns
	}
	return max(1, s.measured[broker])
}

// worker is a fetch loop (one of a source broker's: slot) or a produce
// loop (per destination broker).
type worker struct {
	broker int32
	slot   int
	addr   string
	kick   chan struct{}
	// routed tells a fetch loop that partitions were routed to it (or
	// spread anew): a long poll of an idle session ends early for them.
	routed chan struct{}
	// conn is a produce loop's connection while it has one (for reading
	// its socket options).
	conn atomic.Pointer[kwire.Conn]
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
	illegalLog.CompareAndSwap(nil, log.Named("fetch"))
	dest := kafka.NewCluster("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationSecurity)
	store := newOffsetStore(dest, cfg.OffsetsTopic, ctl.WriteDeadline)
	store.userTimeout = cfg.ProduceTimeout + time.Second // as the produce connections' (sender.go)
	return &Engine{
		cfg:       cfg,
		ctl:       ctl,
		log:       log.Named("fetch"),
		dest:      dest,
		destAdmin: kafka.NewAdmin("destination cluster", cfg.Destination, cfg.ClientID, cfg.DestinationSecurity),
		store:     store,
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
		if err := e.retryStart(ctx, func(ctx context.Context) error { return e.ensureInternalTopic(ctx, t) }); err != nil {
			return err
		}
	}
	if err := e.loadCheckpoints(ctx); err != nil {
		return err
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.goLoop(e.routeLoop)
	e.goLoop(func() { e.tick(e.cfg.Checkpoint, e.checkpoint) })
	e.goLoop(func() { e.tick(restampCheck, e.restampStale) })
	e.goLoop(e.reportLoop)
	e.goLoop(func() { e.tick(idleCheck, e.checkIdle) })
	return nil
}

// loadCheckpoints reads the offsets topic at start (retryStart). The first
// read accepts a high watermark up to 5 s old; a retry asks afresh.
func (e *Engine) loadCheckpoints(ctx context.Context) error {
	maxAge := 5 * time.Second
	return e.retryStart(ctx, func(ctx context.Context) error {
		err := e.store.catchUpAged(ctx, maxAge)
		maxAge = 0
		if err != nil {
			return fmt.Errorf("load checkpoints from %s: %w", e.cfg.OffsetsTopic, err)
		}
		return nil
	})
}

// retryStart runs a start-up step until it succeeds, retrying what a
// broker may answer for a while (a just-created partition's
// UNKNOWN_LEADER_EPOCH, a leader change, a controller moving, a broker
// restarting or not up yet) with a backoff from 200 ms to 5 s, until ctx
// ends: a member never exits for a retriable error (issue 18). A Kafka
// error that no retry fixes (an authorization failure, say) fails at once.
func (e *Engine) retryStart(ctx context.Context, step func(context.Context) error) error {
	backoff := 200 * time.Millisecond
	for {
		err := step(ctx)
		if err == nil {
			return nil
		}
		var kerr *kwire.Error
		if errors.As(err, &kerr) && kerr.Action() == kwire.Fatal {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		e.log.Warn("starting the data path failed on the destination cluster; retrying", zap.Duration("backoff", backoff), zap.Error(err))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
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
	if errors.Is(err, kafka.ErrTopicNotFound) {
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
	clientID := src.ClientID
	if clientID == "" {
		clientID = e.cfg.ClientID
	}
	if s, ok := e.sources[mirror]; ok && slices.Equal(s.cl.Bootstrap, src.Bootstrap) && s.securityKey == src.SecurityKey && s.clientID == clientID {
		if s.conns != src.FetchConnections {
			s.conns = src.FetchConnections
			e.respreadLocked(mirror, s)
		}
		return
	} else if ok {
		// Replaced: its fetch loops see it and exit; its metadata and
		// pooled connections go now; the mirror's partitions are routed
		// anew, to fetch loops of the new source.
		for _, w := range s.fetchers {
			kick(w.kick)
		}
		go s.cl.Close()
		for k, p := range e.parts {
			if k.Mirror == mirror {
				p.srcLeader = -1
			}
		}
		defer kick(e.kickRt)
	}
	e.sources[mirror] = &source{
		cl:          kafka.NewCluster(fmt.Sprintf("source cluster of mirror %s", mirror), src.Bootstrap, clientID, src.Security),
		securityKey: src.SecurityKey,
		clientID:    clientID,
		fetchers:    map[fetcherKey]*worker{},
		conns:       src.FetchConnections,
		measured:    map[int32]int{},
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
			go s.cl.Close()
		}
	}
}

// Assign starts the given partitions that the engine does not hold yet
// (each resumes from its checkpoint, or continues from its handoff) and
// updates the generation of held ones; a held partition whose producer
// identity changed resumes under the new one, and one whose generation
// changed across a fence of its owner (Spec.Fences) resumes with the walk.
// Partitions not named are left alone: the caller releases (Release,
// HandOff, Stop) or drops (Drop) them.
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
		if ok && !p.releasing() && p.spec.Generation != s.Generation && (p.life == lifeDiverged || p.life == lifeFailed || p.life == lifeRenewing || s.AcceptGap) {
			// An operator resumed it (kmirror resume): start over with a
			// walk now, also out of a FAILED backoff, so a gap permission
			// is used by this start and by no later one.
			e.log.Info("partition resumed by the operator", zap.Stringer("partition", k), zap.Bool("accept_gap", s.AcceptGap))
			p.spec = s
			e.dropQueueLocked(p)
			p.moveLife(lifeStarting)
			p.failures = 0
			e.startLocked(p, 0)
			continue
		}
		if ok && !p.releasing() && p.spec.Generation != s.Generation && (p.life == lifeRenewing || !sameProducer(p.spec.Producer, s.Producer)) {
			// A new producer identity (a renewal through raft): resume
			// under it with a walk.
			e.log.Info("partition has a new producer identity; resuming", zap.Stringer("partition", k))
			p.spec = s
			e.dropQueueLocked(p)
			p.moveLife(lifeStarting)
			e.startLocked(p, 0)
			continue
		}
		if ok && !p.releasing() && p.spec.Generation != s.Generation && p.spec.Fences != s.Fences {
			// A new generation across a fence of this member: another
			// owner may have written under the same producer identity
			// while this one was fenced and kept its in-memory position,
			// queue and sequence (issue 19: the next checkpoint moved back
			// behind the other owner's). Resume with the walk.
			e.log.Info("partition has a new generation since this member was fenced; resuming with a walk", zap.Stringer("partition", k),
				zap.Uint64("generation", s.Generation), zap.Uint64("was", p.spec.Generation))
			p.spec = s
			e.dropQueueLocked(p)
			p.moveLife(lifeStarting)
			e.startLocked(p, 0)
			continue
		}
		if ok {
			// The same generation after a fence: the state, read with the
			// lease back, shows nobody else owned it meanwhile.
			p.spec.Fences = s.Fences
			if p.spec.Generation != s.Generation {
				p.spec.Generation = s.Generation
				e.queueReportLocked(p)
			}
			continue
		}
		p = &partition{spec: s, life: lifeStarting, srcLeader: -1, dstLeader: -1, srcEnd: -1, idleSeen: -1, progress: newProgress(time.Now())}
		e.parts[k] = p
		e.heldVersion++
		e.startLocked(p, 0)
	}
}

// parkDivergedLocked applies a control-plane DIVERGED: a running partition
// stops (its position stays for describe); one not held is held stopped at
// its last checkpoint.
func (e *Engine) parkDivergedLocked(k Key, p *partition, s Spec) {
	if p != nil {
		moved := p.spec.Generation != s.Generation
		p.spec.Generation = s.Generation
		if p.life != lifeDiverged && !p.releasing() {
			e.divergeLocked(p, s.Diverged)
		} else if moved {
			e.queueReportLocked(p)
		}
		return
	}
	p = &partition{spec: s, life: lifeDiverged, reason: s.Diverged, srcLeader: -1, dstLeader: -1, srcEnd: -1, idleSeen: -1,
		progress: newProgress(time.Now())}
	if cp, ok := e.store.checkpointOf(k); ok {
		p.pos = Position{SourceOffset: cp.Src, DestinationOffset: cp.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
	} else {
		p.pos = Position{SourceOffset: s.StartOffset}
	}
	e.parts[k] = p
	e.heldVersion++
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
	keys, _ := e.HeldVersioned()
	return keys
}

// HeldVersioned is Held and the version of the set it read, which grows
// whenever a partition is added to the engine or leaves it: a caller that
// saw the same version holds the same set.
func (e *Engine) HeldVersioned() ([]Key, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]Key, 0, len(e.parts))
	for k := range e.parts {
		out = append(out, k)
	}
	return out, e.heldVersion
}

// HeldVersion is the version HeldVersioned would report, without listing
// the partitions: a caller polling for a change copies nothing.
func (e *Engine) HeldVersion() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.heldVersion
}

// updateLocked snapshots p's progress for a checkpoint write and clears
// its unsaved state.
func (e *Engine) updateLocked(p *partition) update {
	segs, dropped := p.xl.takeUnsaved()
	u := update{key: p.key(), gen: p.spec.Generation, segs: segs, dropped: dropped, cp: checkpoint{
		Src: p.pos.SourceOffset, Dst: p.pos.DestinationOffset, Seq: p.nextSeq,
		PID: p.producer.ID, Epoch: p.producer.Epoch, LeaderEpoch: p.pos.SourceLeaderEpoch, Floor: p.xl.Floor(),
	}}
	p.dirty = false
	return u
}

// Statuses returns every held partition's progress, sorted.
func (e *Engine) Statuses() []Status {
	e.mu.Lock()
	out := make([]Status, 0, len(e.parts))
	now := time.Now()
	for k, p := range e.parts {
		st := p.status(now)
		if !p.resumed {
			// Not resumed yet (starting, or failed or diverged in its
			// first resume): the position is the checkpoint, not the
			// zero value; else unknown (-1), but for a partition held
			// DIVERGED by the control plane, which keeps its start offset.
			if cp, ok := e.store.checkpointOf(k); ok {
				st.Position = Position{SourceOffset: cp.Src, DestinationOffset: cp.Dst, SourceLeaderEpoch: cp.LeaderEpoch}
			} else if p.life != lifeDiverged {
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
		out[name] = src.cl.FetchedBytes.Load()
	}
	return out
}

// FetchConnections returns, per mirror and source broker address, how
// many fetch loops (each a connection with a fetch session) this member
// runs: sized from the round trip, or the mirror's fetch.connections
// (fetchconns.go; issue 20).
func (e *Engine) FetchConnections() map[string]map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]map[string]int, len(e.sources))
	for name, src := range e.sources {
		per := map[string]int{}
		for _, w := range src.fetchers {
			per[w.addr]++
		}
		out[name] = per
	}
	return out
}

// ThrottleTime returns, per destination broker address, the produce
// throttle time its quotas asked of this engine since it started
// (throttle_time_ms, KIP-219).
func (e *Engine) ThrottleTime() map[string]time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.throttled)
}

// OldestUnansweredProduce is the earliest DestinationUnanswered of the
// partitions held here, with that partition (zero: every produce was
// answered). One scan of the held partitions.
func (e *Engine) OldestUnansweredProduce() (time.Time, Key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var since time.Time
	var key Key
	for k, p := range e.parts {
		if !p.dstUnanswered.IsZero() && (since.IsZero() || p.dstUnanswered.Before(since)) {
			since, key = p.dstUnanswered, k
		}
	}
	return since, key
}

// Divergences counts the partitions this engine stopped as DIVERGED since
// it started.
func (e *Engine) Divergences() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.divergences
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
		s.cl.Close()
	}
	e.mu.Unlock()
	e.dest.Close()
	e.destAdmin.Close()
	e.store.close()
	return errors.Join(errs...)
}
