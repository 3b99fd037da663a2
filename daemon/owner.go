package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
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
}

func (o *ownerState) init() {
	o.busy = map[fetch.Key]string{}
	o.unverifiedSince = map[fetch.Key]time.Time{}
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
func (m *Member) ownerLoop() {
	changed, stop := m.store.Watch()
	defer stop()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		m.ownerReconcile()
		select {
		case <-m.ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// ownerJob is one thing the owner of a partition must do outside mirroring.
type ownerJob struct {
	kind   string // "handoff", "stop", "pause"
	spec   fetch.Spec
	lease  raftstore.Lease
	moveTo string // for handoff: the next owner
	// For stop: what the last mirrored position records besides offsets.
	clusterID, topicID, reason string
}

func (m *Member) ownerReconcile() {
	if !m.leaseSynced() {
		return // the state may be behind the leader's: act on nothing
	}
	var specs []fetch.Spec
	var jobs []ownerJob
	sources := map[string]fetch.Source{}
	owned := map[fetch.Key]bool{}
	held := map[fetch.Key]bool{}
	for _, k := range m.engine.Held() {
		held[k] = true
	}
	me := m.cfg.NodeID
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			mir, ok := s.Mirrors[t.Mirror]
			if !ok {
				continue
			}
			for i, p := range t.Partitions {
				if p.Owner != me || p.State == raftstore.StateStopped {
					continue
				}
				sources[t.Mirror] = sourceOf(*mir)
				spec := specOf(t, int32(i), p)
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
	for name, src := range sources {
		m.engine.SetSource(name, src)
	}
	mirrors := map[string]bool{}
	m.store.Read(func(s *raftstore.State) {
		for name := range s.Mirrors {
			mirrors[name] = true
		}
	})
	m.engine.RetainSources(mirrors)
	free := specs[:0]
	for _, s := range specs {
		if !m.owner.isBusy(s.Key) {
			free = append(free, s)
		}
	}
	m.engine.Assign(free)
	wanted := map[fetch.Key]bool{}
	for _, s := range free {
		wanted[s.Key] = true
	}
	for _, j := range jobs {
		if m.owner.start(j.spec.Key, j.kind) {
			m.goLoop(func() { m.runJob(j) })
		}
	}
	for _, k := range m.engine.Held() {
		if !wanted[k] && !owned[k] {
			// The lease moved: stop writing at once, no drain (the new
			// owner walks or was handed an exact position).
			m.drop(k, "drop partition")
		}
	}
}

// dropAll drops every partition the engine holds (lease lost).
func (m *Member) dropAll() {
	for _, k := range m.engine.Held() {
		m.drop(k, "drop partition after losing the lease")
	}
}

// drop stops partition k in the engine at once, in the background, unless
// another job runs for it; what names the job in a failure's log line.
func (m *Member) drop(k fetch.Key, what string) {
	if !m.owner.start(k, "drop") {
		return
	}
	m.goLoop(func() {
		defer m.owner.done(k)
		ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		defer cancel()
		if err := m.engine.Drop(ctx, k); err != nil && m.ctx.Err() == nil {
			m.log.Warn(what, zap.Stringer("partition", k), zap.Error(err))
		}
	})
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
		spec.Producer = &fetch.ProducerID{ID: p.Producer.ProducerID, Epoch: p.Producer.Epoch}
	}
	if h := p.Handoff; h != nil && h.Producer.Allocated {
		spec.Handoff = &fetch.Handoff{
			Position: fetch.Position{SourceOffset: h.SourceOffset, DestinationOffset: h.DestinationOffset, SourceLeaderEpoch: h.SourceLeaderEpoch},
			Sequence: h.Sequence,
			Producer: fetch.ProducerID{ID: h.Producer.ProducerID, Epoch: h.Producer.Epoch},
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
func (m *Member) runJob(j ownerJob) {
	k := j.spec.Key
	defer m.owner.done(k)
	switch j.kind {
	case "handoff":
		ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		defer cancel()
		m.log.Info("handoff started", zap.Stringer("partition", k), zap.String("to", j.moveTo))
		h, err := m.engine.HandOff(ctx, k)
		if err != nil {
			m.log.Warn("handoff drain failed; the next owner resumes with a walk", zap.Stringer("partition", k), zap.Error(err))
		}
		cmd := raftstore.ReleasePartition{Key: partitionKey(k), Lease: j.lease}
		if h != nil {
			cmd.Checkpoint = &raftstore.Checkpoint{
				SourceOffset: h.Position.SourceOffset, DestinationOffset: h.Position.DestinationOffset,
				SourceLeaderEpoch: h.Position.SourceLeaderEpoch, Sequence: h.Sequence,
				Producer: raftstore.ProducerIdentity{ProducerID: h.Producer.ID, Epoch: h.Producer.Epoch, Allocated: true},
			}
		}
		m.submitRetry(ctx, cmd)
		m.log.Info("partition handed off", zap.Stringer("partition", k), zap.Bool("exact", h != nil))
	case "pause":
		ctx, cancel := context.WithTimeout(m.ctx, 30*time.Second)
		defer cancel()
		pos, err := m.engine.Release(ctx, k)
		if err != nil {
			m.log.Warn("pause drain failed; the partition resumes from its last checkpoint with a walk", zap.Stringer("partition", k), zap.Error(err))
			return
		}
		m.log.Info("partition paused", zap.Stringer("partition", k), zap.Int64("source_offset", pos.SourceOffset),
			zap.Int64("destination_offset", pos.DestinationOffset))
	case "stop":
		ctx, cancel := context.WithTimeout(m.ctx, 2*time.Minute)
		defer cancel()
		pos, err := m.engine.Stop(ctx, j.spec)
		var uv *fetch.UnverifiedError
		switch {
		case errors.As(err, &uv) && m.owner.unverifiedFor(k, true) >= stopVerifyWait:
			// A failover must finish without the source: the last
			// verified position is recorded, and the records after it
			// are named.
			pos = uv.Known
			j.reason = strings.TrimPrefix(j.reason+"; ", "; ") + fmt.Sprintf("destination offsets %d..%d after the recorded position "+
				"could not be verified against the source (%v): they are copies kmirror wrote whose acknowledgement was lost, "+
				"not counted as mirrored", uv.Known.DestinationOffset, uv.End-1, uv.Err)
			m.log.Warn("stopping at the last verified position", zap.Stringer("partition", k), zap.Error(err))
		case err != nil:
			m.log.Warn("stop partition failed; retrying", zap.Stringer("partition", k), zap.Error(err))
			sleepCtx(m.ctx, time.Second)
			return
		}
		m.owner.unverifiedFor(k, false)
		gctx, gcancel := context.WithTimeout(ctx, finalGroupSyncTimeout)
		m.groups.finalSync(gctx, j.spec)
		gcancel()
		rec := raftstore.Position{SourceOffset: pos.SourceOffset, DestinationOffset: pos.DestinationOffset,
			SourceLeaderEpoch: pos.SourceLeaderEpoch, SourceClusterID: j.clusterID, SourceTopicID: j.topicID}
		if err := m.engine.RecordStopped(ctx, k, m.lastMirrored(ctx, j, rec)); err != nil {
			m.log.Warn("record last mirrored position failed; retrying", zap.Stringer("partition", k), zap.Error(err))
			return
		}
		stopped := raftstore.PartitionStopped{Key: partitionKey(k), Lease: j.lease, Position: rec}
		if uv != nil {
			stopped.Reason = j.reason
		}
		m.submitRetry(ctx, stopped)
	}
}

// lastMirrored is the state topic record of a stopped partition.
func (m *Member) lastMirrored(ctx context.Context, j ownerJob, pos raftstore.Position) truncate.LastMirrored {
	reason := j.reason
	if reason == "" {
		reason = "remove"
	}
	dstCluster, err := m.dest.ClusterID(ctx)
	if err != nil {
		m.log.Warn("destination cluster ID unknown for the last mirrored position", zap.Error(err))
	}
	k := j.spec.Key
	return truncate.LastMirrored{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition,
		SourceOffset: pos.SourceOffset, DestinationOffset: pos.DestinationOffset, SourceLeaderEpoch: pos.SourceLeaderEpoch,
		SourceClusterID: pos.SourceClusterID, SourceTopicID: pos.SourceTopicID,
		DestinationClusterID: dstCluster, DestinationTopicID: j.spec.DestTopicID,
		StoppedAtMs: time.Now().UnixMilli(), Reason: reason}
}

// submitRetry submits cmd until it is applied, refused for good (a stale
// lease: the state moved on), or ctx ends.
func (m *Member) submitRetry(ctx context.Context, cmd raftstore.Command) {
	for {
		err := m.submit(ctx, cmd)
		if err == nil || permanent(err) {
			if err != nil {
				m.log.Info("command refused", zap.Stringer("command", cmd.Type()), zap.Error(err))
			}
			return
		}
		if ctx.Err() != nil {
			m.log.Warn("command not applied", zap.Stringer("command", cmd.Type()), zap.Error(err))
			return
		}
		sleepCtx(ctx, 300*time.Millisecond)
	}
}

// permanent reports whether a refused command must not be retried.
func permanent(err error) bool {
	return errors.Is(err, api.ErrStale) || errors.Is(err, api.ErrInvalid) || errors.Is(err, api.ErrNotFound) || errors.Is(err, api.ErrExists)
}

// handOffAll moves this member's partitions to the others before it stops
// (SIGTERM), when there are others: it marks itself draining, and the
// leader moves its partitions by graceful handoff. A restart clears the
// mark (announce).
func (m *Member) handOffAll(ctx context.Context) {
	others := false
	m.store.Read(func(s *raftstore.State) {
		for id, mem := range s.Members {
			if id != m.cfg.NodeID && !mem.Draining {
				others = true
			}
		}
	})
	if !others {
		return
	}
	// The mark tells the next start that this drain was the member's own,
	// to be lifted then (an operator's drain stays).
	if err := os.WriteFile(filepath.Join(m.cfg.DataDir, drainedOnStop), nil, 0o640); err != nil {
		m.log.Warn("record the shutdown drain", zap.Error(err))
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := m.submit(dctx, raftstore.SetDraining{ID: m.cfg.NodeID, Draining: true})
	cancel()
	if err != nil {
		m.log.Warn("could not start handing off partitions; they are drained and taken over instead", zap.Error(err))
		return
	}
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	changed, stop := m.store.Watch()
	defer stop()
	for {
		n := m.ownedCount()
		if n == 0 {
			m.log.Info("every partition handed off")
			return
		}
		select {
		case <-wctx.Done():
			m.log.Warn("handoff did not finish in time; draining the rest", zap.Int("partitions", n))
			return
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}

// ownedCount counts the partitions leased to this member that are not
// stopped.
func (m *Member) ownedCount() int {
	n := 0
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner == m.cfg.NodeID && p.State != raftstore.StateStopped {
					n++
				}
			}
		}
	})
	return n
}

// drainedOnStop, in data_dir, marks a drain the member did itself at its
// last shutdown (SIGTERM): the next start lifts it.
const drainedOnStop = "drained-on-stop"

// announce records this member in the state as joined (it runs with
// raft state), with its addresses, and lifts a drain left by its own last
// shutdown. It writes only those fields: a drain an operator asks for
// meanwhile stays.
func (m *Member) announce() {
	self := m.self()
	marker := filepath.Join(m.cfg.DataDir, drainedOnStop)
	_, err := os.Stat(marker)
	undrain := err == nil
	want := raftstore.Member{ID: m.cfg.NodeID, RaftAddr: m.cfg.RaftAdvertise, HTTPAddr: m.advertisedHTTP(), Voter: self.IsVoter(), Joined: true}
	for m.ctx.Err() == nil {
		var cur raftstore.Member
		found := false
		m.store.Read(func(s *raftstore.State) {
			if mem, ok := s.Members[m.cfg.NodeID]; ok {
				cur, found = *mem, true
			}
		})
		if found {
			want.Voter = cur.Voter
			want.Draining = cur.Draining && !undrain
			if cur == want {
				if undrain {
					_ = os.Remove(marker)
				}
				return
			}
		}
		ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
		err := m.submit(ctx, raftstore.UpsertMember{Member: want})
		cancel()
		if err != nil {
			m.log.Debug("announce this member to the leader", zap.Error(err))
		}
		// Check again once this member's state has caught up: the record
		// must show, whoever wrote last.
		sleepCtx(m.ctx, time.Second)
	}
}

// control implements fetch.Control: the engine's reports reach the raft
// leader from whichever member runs the partition, retried until applied.
type control struct{ m *Member }

func (c *control) SaveProducer(ctx context.Context, k fetch.Key, gen uint64, id fetch.ProducerID) error {
	return c.m.submit(ctx, raftstore.SetProducer{
		Key:        partitionKey(k),
		Producer:   raftstore.ProducerIdentity{ProducerID: id.ID, Epoch: id.Epoch, Allocated: true},
		Generation: gen,
		Owner:      c.m.cfg.NodeID,
	})
}

// Report records FAILED and DIVERGED (and the return to MIRRORING) in the
// replicated state, so describe shows the reason from any member.
func (c *control) Report(k fetch.Key, state fetch.State, reason string, gapBelow int64) {
	var s raftstore.TopicState
	switch state {
	case fetch.Failed:
		s = raftstore.StateFailed
	case fetch.Diverged:
		s = raftstore.StateDiverged
	case fetch.Mirroring:
		s = raftstore.StateMirroring
	default:
		return
	}
	var cur raftstore.PartitionInfo
	found := false
	c.m.store.Read(func(st *raftstore.State) {
		if p, ok := st.Partition(partitionKey(k)); ok {
			cur, found = *p, true
		}
	})
	if !found || cur.Owner != c.m.cfg.NodeID || cur.State == raftstore.StateStopping || cur.State == raftstore.StateStopped {
		return
	}
	key := "state " + k.String()
	// This member's copy of the state may lag the leader's: a report it
	// sent (FAILED, say) may be applied after this read. So the replicated
	// state counts as told only if the last report this member put for the
	// partition says the same; otherwise this one must still go out, or the
	// late FAILED would stay shown for a partition that mirrors.
	same := func(last raftstore.Command) bool {
		l, ok := last.(raftstore.SetPartitionState)
		return ok && l.State == s && l.Reason == reason && l.GapBelow == gapBelow
	}
	if cur.State == s && cur.Reason == reason && cur.GapBelow == gapBelow && c.m.out.lastIs(key, same) {
		c.m.out.drop(key) // a newer report may be waiting: this one is the truth
		return
	}
	c.m.out.put(key, raftstore.SetPartitionState{Key: partitionKey(k), State: s, Reason: reason, GapBelow: gapBelow,
		Lease: raftstore.Lease{Owner: c.m.cfg.NodeID, Generation: cur.Generation}})
}

func (c *control) RenewProducer(k fetch.Key, gen uint64, reason string) {
	c.m.out.put("renew "+k.String(), raftstore.RenewProducer{Key: partitionKey(k), Reason: reason,
		Lease: raftstore.Lease{Owner: c.m.cfg.NodeID, Generation: gen}})
}

// RecordGap records a gap skipped under kmirror resume --accept-gap;
// synchronous, since the partition must not mirror past an unrecorded gap.
func (c *control) RecordGap(ctx context.Context, k fetch.Key, gen uint64, from, to int64) error {
	return c.m.submit(ctx, raftstore.RecordGap{Key: partitionKey(k), From: from, To: to,
		Lease: raftstore.Lease{Owner: c.m.cfg.NodeID, Generation: gen}})
}

// WriteDeadline is the end of this member's lease (lease.go).
func (c *control) WriteDeadline() time.Time { return c.m.writeDeadline() }

// outbox holds the latest command per key that must reach the leader, and
// retries each until it is applied or refused for good. A newer command
// for the same key replaces an older one not yet sent (desired state, not
// a queue of events).
type outbox struct {
	m    *Member
	mu   sync.Mutex
	cmds map[string]pendingCmd
	// last is the latest command put under each key, kept after it was
	// sent (see lastIs).
	last map[string]raftstore.Command
	seq  uint64
	kick chan struct{}
}

type pendingCmd struct {
	cmd raftstore.Command
	seq uint64
}

func newOutbox(m *Member) *outbox {
	return &outbox{m: m, cmds: map[string]pendingCmd{}, last: map[string]raftstore.Command{}, kick: make(chan struct{}, 1)}
}

// lastIs reports whether the latest command put under key satisfies same,
// or none was put since this member started.
func (o *outbox) lastIs(key string, same func(raftstore.Command) bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	last, ok := o.last[key]
	return !ok || same(last)
}

func (o *outbox) put(key string, cmd raftstore.Command) {
	o.mu.Lock()
	o.seq++
	o.cmds[key] = pendingCmd{cmd, o.seq}
	o.last[key] = cmd
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// drop forgets the command waiting under key.
func (o *outbox) drop(key string) {
	o.mu.Lock()
	delete(o.cmds, key)
	o.mu.Unlock()
}

func (o *outbox) run() {
	for {
		select {
		case <-o.m.ctx.Done():
			return
		case <-o.kick:
		case <-time.After(500 * time.Millisecond):
		}
		o.flush()
	}
}

// flush submits each waiting command once; a command stays waiting when its
// submit failed and may succeed later, or when a newer one replaced it.
func (o *outbox) flush() {
	o.mu.Lock()
	batch := make(map[string]pendingCmd, len(o.cmds))
	for k, c := range o.cmds {
		batch[k] = c
	}
	o.mu.Unlock()
	for key, pc := range batch {
		ctx, cancel := context.WithTimeout(o.m.ctx, 5*time.Second)
		err := o.m.submit(ctx, pc.cmd)
		cancel()
		if err != nil && !permanent(err) {
			continue
		}
		if err != nil {
			o.m.log.Info("report refused", zap.String("report", key), zap.Error(err))
		}
		o.mu.Lock()
		if o.cmds[key].seq == pc.seq {
			delete(o.cmds, key)
		}
		o.mu.Unlock()
	}
}
