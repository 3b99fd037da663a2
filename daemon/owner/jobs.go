package owner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// ownerState tracks the partition jobs this member runs outside the
// engine's normal mirroring: handoffs, stops and drops. A partition with a
// job is kept out of the engine's assignment until the job ends.
type ownerState struct {
	mu   sync.Mutex
	busy map[fetch.Key]string
	// unverifiedSince is when a stop of the partition first failed to
	// verify records past its checkpoint (fetch.UnverifiedError).
	unverifiedSince map[fetch.Key]time.Time
	// finished holds the handoffs and stops this member completed, by the
	// partition's generation: until its own copy of the state shows the
	// command applied, the partition still looks STOPPING (or moving) and
	// owned here, and the job must not run again (issue 18: stops ran
	// twice and wrote two last mirrored positions).
	finished map[fetch.Key]finishedJob
}

type finishedJob struct {
	kind       string
	generation uint64
}

func (o *ownerState) init() {
	o.busy = map[fetch.Key]string{}
	o.unverifiedSince = map[fetch.Key]time.Time{}
	o.finished = map[fetch.Key]finishedJob{}
}

// finish records that job kind completed for k in generation g.
func (o *ownerState) finish(k fetch.Key, kind string, g uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.finished[k] = finishedJob{kind, g}
}

// isFinished reports whether job kind already completed for k in g.
func (o *ownerState) isFinished(k fetch.Key, kind string, g uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.finished[k] == finishedJob{kind, g}
}

// forgetFinished drops the records of partitions that no longer wait on a
// job (their state moved on).
func (o *ownerState) forgetFinished(waiting map[fetch.Key]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.finished {
		if !waiting[k] {
			delete(o.finished, k)
		}
	}
}

// unverifiedFor returns how long stops of k have failed to verify the
// records past its checkpoint (0 the first time); ok false resets it.
func (o *ownerState) unverifiedFor(k fetch.Key, ok bool) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !ok {
		delete(o.unverifiedSince, k)
		return 0
	}
	since, seen := o.unverifiedSince[k]
	if !seen {
		o.unverifiedSince[k] = time.Now()
		return 0
	}
	return time.Since(since)
}

// start marks k busy with job and reports whether it was free.
func (o *ownerState) start(k fetch.Key, job string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.busy[k]; ok {
		return false
	}
	o.busy[k] = job
	return true
}

func (o *ownerState) done(k fetch.Key) {
	o.mu.Lock()
	delete(o.busy, k)
	o.mu.Unlock()
}

func (o *ownerState) isBusy(k fetch.Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.busy[k]
	return ok
}

// ownerLoop gives the data path the partitions leased to this member and
// carries out what the state asks of their owner (handoff, stop), on every
// state change and every second.
func (o *Owner) ownerLoop() {
	changed, stop := o.store.Watch()
	defer stop()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var (
		settled bool      // the last reconcile found nothing left to do
		seen    uint64    // the engine's held version it read
		at      time.Time // when it ran
	)
	for {
		// A settled reconcile is repeated only when the replicated state
		// or the engine's set of partitions changed, or after
		// settledReconcileEvery: with 10,000 idle partitions the reconcile
		// every second was a third of an idle member's CPU (issue 20).
		if v := o.engine.HeldVersion(); !settled || v != seen || time.Since(at) >= settledReconcileEvery {
			settled, seen = o.ownerReconcile()
			at = time.Now()
		}
		select {
		case <-o.ctx.Done():
			return
		case <-changed:
			settled = false
		case <-t.C:
		}
	}
}

// settledReconcileEvery is how often a reconcile that found nothing to do
// runs again while nothing changed: a net under what the state and the
// engine's version do not show (a member's security files resolved again
// for the engine's sources).
const settledReconcileEvery = 10 * time.Second

// ownerJob is one thing the owner of a partition must do outside mirroring.
type ownerJob struct {
	kind   string // "handoff", "stop", "pause"
	spec   fetch.Spec
	lease  raftstore.Lease
	moveTo string // for handoff: the next owner
	// For stop: what the last mirrored position records besides offsets.
	clusterID, topicID, reason string
}

// ownerReconcile starts, stops and hands off this member's partitions as
// the replicated state says. settled reports that it found nothing left to
// do (no job, no drop, no partition busy with one), as of the engine's
// held version.
func (o *Owner) ownerReconcile() (settled bool, version uint64) {
	synced, fences := o.leaseSynced()
	if !synced {
		return false, 0 // the state may be behind the leader's: act on nothing
	}
	keys, version := o.engine.HeldVersioned()
	held := make(map[fetch.Key]bool, len(keys))
	for _, k := range keys {
		held[k] = true
	}
	w := o.readOwned(held, fences)
	if synced, now := o.leaseSynced(); !synced || now != fences {
		// The lease was lost while the state was read: the specs carry
		// the fence count from before it, and a generation changed by a
		// takeover after the fence would be trusted in place.
		return false, 0
	}
	specs, jobs, sources, owned := w.specs, w.jobs, w.sources, w.owned
	for name, src := range sources {
		o.engine.SetSource(name, src)
	}
	mirrors := map[string]bool{}
	o.store.Read(func(s *raftstore.State) {
		for name := range s.Mirrors {
			mirrors[name] = true
		}
	})
	o.engine.RetainSources(mirrors)
	free := specs[:0]
	for _, s := range specs {
		if !o.owner.isBusy(s.Key) {
			free = append(free, s)
		}
	}
	settled = len(free) == len(specs) && len(jobs) == 0
	o.engine.Assign(free)
	wanted := make(map[fetch.Key]bool, len(free))
	for _, s := range free {
		wanted[s.Key] = true
	}
	waiting := map[fetch.Key]bool{}
	for _, j := range jobs {
		waiting[j.spec.Key] = true
		if o.owner.isFinished(j.spec.Key, j.kind, j.lease.Generation) {
			continue // done; this member's state has not shown it applied yet
		}
		if o.owner.start(j.spec.Key, j.kind) {
			o.member.Go(func() { o.runJob(j) })
		}
	}
	o.owner.forgetFinished(waiting)
	for _, k := range o.engine.Held() {
		if !wanted[k] && !owned[k] {
			// The lease moved: stop writing at once, no drain (the new
			// owner walks or was handed an exact position).
			o.drop(k, "drop partition")
			settled = false
		}
	}
	return settled, version
}

// ownedWork is what the replicated state asks of this member's partitions.
type ownedWork struct {
	specs   []fetch.Spec // to mirror (or hold DIVERGED)
	jobs    []ownerJob   // handoffs, stops, pauses
	sources map[string]fetch.Source
	owned   map[fetch.Key]bool
}

// readOwned reads the partitions the state leases to this member (held:
// those the engine holds), each spec stamped with fences, the count of
// lease losses it was read under (fetch.Spec.Fences).
func (o *Owner) readOwned(held map[fetch.Key]bool, fences uint64) ownedWork {
	specs := make([]fetch.Spec, 0, len(held))
	var jobs []ownerJob
	sources := map[string]fetch.Source{}
	owned := make(map[fetch.Key]bool, len(held))
	me := o.cfg.NodeID
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			mir, ok := s.Mirrors[t.Mirror]
			if !ok {
				continue
			}
			for i, p := range t.Partitions {
				if p.Owner != me || p.State == raftstore.StateStopped {
					continue
				}
				if _, ok := sources[t.Mirror]; !ok {
					// Once per mirror: parsing its security properties
					// for each of 10,000 partitions every second was a
					// fifth of an idle member's CPU (issue 20).
					sources[t.Mirror] = o.member.Source(*mir)
				}
				spec := specOf(t, int32(i), p)
				spec.Fences = fences
				owned[spec.Key] = true
				lease := raftstore.Lease{Owner: me, Generation: p.Generation}
				switch {
				case t.State == raftstore.StateStopping || p.State == raftstore.StateStopping:
					jobs = append(jobs, ownerJob{kind: "stop", spec: spec, lease: lease, clusterID: mir.SourceClusterID, topicID: t.SourceTopicID, reason: t.Reason})
				case (t.State == raftstore.StatePaused || p.State == raftstore.StatePaused) && held[spec.Key]:
					jobs = append(jobs, ownerJob{kind: "pause", spec: spec, lease: lease})
				case t.State != raftstore.StateMirroring && t.State != raftstore.StateFailed:
				case p.State == raftstore.StateDiverged:
					// Held stopped, with its position for describe; a
					// divergence the leader found stops it here.
					spec.Diverged = p.Reason
					if spec.Diverged == "" {
						spec.Diverged = "diverged"
					}
					specs = append(specs, spec)
				case p.MoveTo != "":
					jobs = append(jobs, ownerJob{kind: "handoff", spec: spec, lease: lease, moveTo: p.MoveTo})
				default:
					specs = append(specs, spec)
				}
			}
		}
	})
	return ownedWork{specs: specs, jobs: jobs, sources: sources, owned: owned}
}

// dropAll drops every partition the engine holds (lease lost); without a
// data path (RunLease alone) there is none. A partition busy with a job
// (a handoff's drain, a stop, a pause) is dropped under it: its queue,
// fetched under the lost lease, must not be sent once the lease is back
// and the partition may have moved meanwhile (issue 19). The job then
// finds it dropped: a drain ends unclean, and the handoff or stop settles
// the position by the walk.
func (o *Owner) dropAll() {
	if o.engine == nil {
		return
	}
	const what = "drop partition after losing the lease"
	for _, k := range o.engine.Held() {
		if !o.drop(k, what) {
			o.member.Go(func() { o.dropNow(k, what) })
		}
	}
}

// drop stops partition k in the engine at once, in the background, unless
// another job runs for it (then it reports false); what names the job in a
// failure's log line.
func (o *Owner) drop(k fetch.Key, what string) bool {
	if !o.owner.start(k, "drop") {
		return false
	}
	o.member.Go(func() {
		defer o.owner.done(k)
		o.dropNow(k, what)
	})
	return true
}

// dropNow stops partition k in the engine and waits for its produce in
// flight, if any, to end.
func (o *Owner) dropNow(k fetch.Key, what string) {
	ctx, cancel := context.WithTimeout(o.ctx, 30*time.Second)
	defer cancel()
	if err := o.engine.Drop(ctx, k); err != nil && o.ctx.Err() == nil {
		o.log.Warn(what, zap.Stringer("partition", k), zap.Error(err))
	}
}

// specOf is the engine's lease of partition i of t.
func specOf(t *raftstore.MirrorTopic, i int32, p raftstore.PartitionInfo) fetch.Spec {
	spec := fetch.Spec{
		Key:            fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: i},
		Generation:     p.Generation,
		StartOffset:    p.StartOffset,
		SourceTopicID:  t.SourceTopicID,
		DestTopicID:    t.DestTopicID,
		AcceptGap:      p.AcceptGap,
		AcceptGapBelow: p.AcceptGapBelow,
	}
	if p.Producer.Allocated {
		spec.Producer = &kafka.ProducerID{ID: p.Producer.ProducerID, Epoch: p.Producer.Epoch}
	}
	if h := p.Handoff; h != nil && h.Producer.Allocated {
		spec.Handoff = &fetch.Handoff{
			Position: fetch.Position{SourceOffset: h.SourceOffset, DestinationOffset: h.DestinationOffset, SourceLeaderEpoch: h.SourceLeaderEpoch},
			Sequence: h.Sequence,
			Producer: kafka.ProducerID{ID: h.Producer.ProducerID, Epoch: h.Producer.Epoch},
		}
	}
	return spec
}

func partitionKey(k fetch.Key) raftstore.PartitionKey {
	return raftstore.PartitionKey{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition}
}

// stopVerifyWait is how long a stop retries verifying records past a
// partition's checkpoint against an unreachable source before it records
// the last verified position.
const stopVerifyWait = 30 * time.Second

// finalGroupSyncTimeout bounds the group sync of a stopping partition: an
// emergency failover, with the source gone, must not wait on it.
const finalGroupSyncTimeout = 10 * time.Second

// runJob carries out a handoff or a stop; a failed stop is retried by the
// next reconcile, since the partition stays STOPPING and owned.
func (o *Owner) runJob(j ownerJob) {
	k := j.spec.Key
	defer o.owner.done(k)
	switch j.kind {
	case "handoff":
		o.handOff(j)
	case "pause":
		ctx, cancel := context.WithTimeout(o.ctx, 30*time.Second)
		defer cancel()
		pos, err := o.engine.Release(ctx, k)
		if err != nil {
			o.log.Warn("pause drain failed; the partition resumes from its last checkpoint with a walk", zap.Stringer("partition", k), zap.Error(err))
			return
		}
		o.log.Info("partition paused", zap.Stringer("partition", k), zap.Int64("source_offset", pos.SourceOffset),
			zap.Int64("destination_offset", pos.DestinationOffset))
	case "stop":
		ctx, cancel := context.WithTimeout(o.ctx, 2*time.Minute)
		defer cancel()
		pos, err := o.engine.Stop(ctx, j.spec)
		var uv *fetch.UnverifiedError
		switch {
		case errors.As(err, &uv) && (o.member.SourceUnreachable(k.Mirror) || o.owner.unverifiedFor(k, true) >= stopVerifyWait):
			// A failover must finish without the source: the last
			// verified position is recorded, and the records after it
			// are named, and verified once the source answers again
			// (the leader's SettleStopped). With the source known
			// unreachable (this member's probe), at once: that is why
			// an automatic failover was decided (issue 18: recovery
			// waited 30 s more).
			pos = uv.Known
			j.reason = strings.TrimPrefix(j.reason+"; ", "; ") + unverifiedReason(uv)
			o.log.Warn("stopping at the last verified position", zap.Stringer("partition", k), zap.Error(err))
		case err != nil:
			o.log.Warn("stop partition failed; retrying", zap.Stringer("partition", k), zap.Error(err))
			sleepCtx(o.ctx, time.Second)
			return
		}
		o.owner.unverifiedFor(k, false)
		if o.member.SourceUnreachable(k.Mirror) {
			// A stalled source would hold the stop for the whole bound
			// (issue 18: a stalled source failed over slower than a dead one).
			o.groups.SkipFinal(k, "this member's probe finds the source not answering")
		} else {
			gctx, gcancel := context.WithTimeout(ctx, finalGroupSyncTimeout)
			o.groups.FinalSync(gctx, j.spec)
			gcancel()
		}
		rec := raftstore.Position{SourceOffset: pos.SourceOffset, DestinationOffset: pos.DestinationOffset,
			SourceLeaderEpoch: pos.SourceLeaderEpoch, SourceClusterID: j.clusterID, SourceTopicID: j.topicID}
		if err := o.RecordLastMirrored(ctx, j.spec, rec, j.reason); err != nil {
			o.log.Warn("record last mirrored position failed; retrying", zap.Stringer("partition", k), zap.Error(err))
			return
		}
		stopped := raftstore.PartitionStopped{Key: partitionKey(k), Lease: j.lease, Position: rec, AtMs: time.Now().UnixMilli()}
		if uv != nil {
			stopped.Reason, stopped.UnverifiedEnd = j.reason, uv.End
		}
		if o.submitRetry(ctx, stopped) {
			o.owner.finish(k, j.kind, j.lease.Generation)
		}
	}
}

// unverifiedReason says what a position recorded at uv.Known leaves out.
func unverifiedReason(uv *fetch.UnverifiedError) string {
	return fmt.Sprintf("destination offsets %d..%d after the recorded position could not be verified against the source (%v): "+
		"they are copies kmirror wrote whose acknowledgement was lost, not counted as mirrored until kmirror verifies them "+
		"once the source answers again", uv.Known.DestinationOffset, uv.End-1, uv.Err)
}

// RecordLastMirrored writes a stopped partition's last mirrored position
// to the state topic (__kmirror_state), where the other side reads it with
// plain Kafka (design.md section 8); reason says why it stopped ("":
// remove). Errors are the destination's.
func (o *Owner) RecordLastMirrored(ctx context.Context, spec fetch.Spec, pos raftstore.Position, reason string) error {
	if reason == "" {
		reason = "remove"
	}
	dstCluster, err := o.member.DestinationClusterID(ctx)
	if err != nil {
		o.log.Warn("destination cluster ID unknown for the last mirrored position", zap.Error(err))
	}
	k := spec.Key
	return o.engine.RecordStopped(ctx, k, truncate.LastMirrored{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition,
		SourceOffset: pos.SourceOffset, DestinationOffset: pos.DestinationOffset, SourceLeaderEpoch: pos.SourceLeaderEpoch,
		SourceClusterID: pos.SourceClusterID, SourceTopicID: pos.SourceTopicID,
		DestinationClusterID: dstCluster, DestinationTopicID: spec.DestTopicID,
		StoppedAtMs: time.Now().UnixMilli(), Reason: reason})
}
