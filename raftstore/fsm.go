package raftstore

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"

	"github.com/hashicorp/raft"
)

// Errors an applied command can return, wrapped with what was not found,
// already existed or was stale. Check them with errors.Is.
var (
	ErrNotFound        = errors.New("not found")
	ErrExists          = errors.New("already exists")
	ErrStaleGeneration = errors.New("stale assignment generation")
	ErrInvalid         = errors.New("invalid command")
)

// FSM is the raft state machine holding State. Apply is deterministic: it
// reads nothing but the log entry and the current state.
type FSM struct {
	mu    sync.RWMutex
	state *State

	watchMu   sync.Mutex
	watchers  map[uint64]chan struct{}
	nextWatch uint64
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM with an empty state.
func NewFSM() *FSM {
	return &FSM{state: NewState(), watchers: make(map[uint64]chan struct{})}
}

// Read calls fn with the current state under a read lock. fn must not
// modify the state nor keep it after returning; use State.Clone for that.
func (f *FSM) Read(fn func(*State)) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	fn(f.state)
}

// Watch returns a channel that receives after every change to the state
// (applied command or restored snapshot). Notifications coalesce: one
// receive may stand for several changes, so read the state after each
// receive. cancel stops the notifications; it does not close the channel.
func (f *FSM) Watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	f.watchMu.Lock()
	id := f.nextWatch
	f.nextWatch++
	f.watchers[id] = ch
	f.watchMu.Unlock()
	return ch, func() {
		f.watchMu.Lock()
		delete(f.watchers, id)
		f.watchMu.Unlock()
	}
}

func (f *FSM) notify() {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	for _, ch := range f.watchers {
		select {
		case ch <- struct{}{}:
		default: // a notification is already pending
		}
	}
}

// Apply applies one committed log entry. The response is nil or the error
// the command failed with (the state is then unchanged). An entry this
// build cannot decode panics, unless its type is ignorable: skipping an
// unknown command would let this member silently diverge from the others.
func (f *FSM) Apply(l *raft.Log) interface{} {
	cmd, err := Decode(l.Data)
	if err != nil && !(errors.Is(err, ErrUnknownCommand) && CommandType(l.Data[0]).Ignorable()) {
		panic(fmt.Errorf("raft log entry %d: %w; this kmirror build cannot apply it, upgrade it to the version of the other members", l.Index, err))
	}
	var resp error
	f.mu.Lock()
	if cmd != nil {
		f.state.appendedAtMs = 0
		if !l.AppendedAt.IsZero() {
			f.state.appendedAtMs = l.AppendedAt.UnixMilli()
		}
		resp = commands[cmd.Type()].apply(f.state, cmd, l.Index)
	}
	f.state.Index = l.Index
	f.mu.Unlock()
	f.notify()
	return resp
}

// Snapshot captures a copy of the state; Persist writes it while Apply
// goes on.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return &fsmSnapshot{state: f.state.Clone()}, nil
}

// Restore replaces the state with the snapshot read from rc. The old state
// stays in place if the snapshot cannot be read. raft closes rc.
func (f *FSM) Restore(rc io.ReadCloser) error {
	s, err := readSnapshot(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = s
	f.mu.Unlock()
	f.notify()
	return nil
}

func (s *State) applyAddTopic(c AddTopic, index uint64) error {
	t := c.Topic
	if t.Topic == "" {
		return fmt.Errorf("%w: topic name is empty (mirror %q)", ErrInvalid, t.Mirror)
	}
	if !knownState(t.State) {
		return fmt.Errorf("%w: topic %q has unknown state %q", ErrInvalid, TopicKey(t.Mirror, t.Topic), t.State)
	}
	if _, ok := s.Mirrors[t.Mirror]; !ok {
		return fmt.Errorf("%w: mirror %q", ErrNotFound, t.Mirror)
	}
	if old, ok := s.Topic(t.Mirror, t.Topic); ok && old.State != StateStopped {
		return fmt.Errorf("%w: topic %q", ErrExists, TopicKey(t.Mirror, t.Topic))
	}
	// A STOPPED topic (removed: mirrored no more) is replaced: mirroring
	// it again starts over.
	s.Topics[TopicKey(t.Mirror, t.Topic)] = t.Clone()
	return nil
}

func (s *State) applySetTopicState(c SetTopicState, _ uint64) error {
	if !knownState(c.State) {
		return fmt.Errorf("%w: unknown topic state %q", ErrInvalid, c.State)
	}
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	t.State, t.Reason = c.State, c.Reason
	if c.DestTopicID != "" {
		t.DestTopicID = c.DestTopicID
	}
	if c.State == StateFailed || c.State == StateDiverged {
		return nil
	}
	for i := range t.Partitions {
		p := &t.Partitions[i]
		switch {
		case p.State == StateStopped:
		case p.State == StateDiverged && c.State != StateStopping:
		default:
			reason := c.Reason
			if reason == "" && c.State == StateStopping && (p.State == StateDiverged || p.State == StateFailed) && p.Reason != "" {
				reason = fmt.Sprintf("stopped while %s: %s", p.State, p.Reason) // kept through STOPPED
			}
			s.enter(p, c.State)
			p.Reason = reason
		}
	}
	return nil
}

func (s *State) applySetPartitionState(c SetPartitionState, index uint64) error {
	if !knownState(c.State) {
		return fmt.Errorf("%w: unknown partition state %q", ErrInvalid, c.State)
	}
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if c.Owner != "" { // a member's report: its lease was checked (LeaseFromMember)
		if p.State == StateStopping || p.State == StateStopped {
			return fmt.Errorf("%w: partition %s is %s; its owner records it stopped instead", ErrInvalid, c.Key, p.State)
		}
	}
	s.enter(p, c.State)
	p.Reason, p.GapBelow = c.Reason, c.GapBelow
	if c.Owner == "" && c.State == StateDiverged && p.Owner != "" {
		// The leader's decision (a destination topic recreated, say): a
		// new generation, so the owner's reports observed before it are
		// refused instead of turning the partition back (issue 19).
		p.Generation = index
	}
	return nil
}

func (s *State) applyAssign(c Assign, index uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.Owner, p.Generation, p.MoveTo, p.Handoff = c.Owner, index, "", nil
	return nil
}

// applyAssignPartitions moves every partition whose generation is still the
// one the leader decided on; the others are left for the leader's next
// round. A takeover drops the handoff checkpoint; the producer identity
// stays (fetch/DESIGN.md, fencing).
func (s *State) applyAssignPartitions(c AssignPartitions, index uint64) error {
	for _, a := range c.Assignments {
		p, ok := s.Partition(a.Key)
		if !ok || p.Generation != a.From || p.State == StateStopped {
			continue
		}
		if a.Takeover {
			p.Handoff = nil
		}
		p.Owner, p.Generation, p.MoveTo = a.Owner, index, ""
	}
	return nil
}

func (s *State) applySetProducer(c SetProducer, _ uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.Producer = c.Producer // the lease was checked (LeaseGeneration)
	return nil
}

func (s *State) applyRenewProducer(c RenewProducer, index uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.Producer = p.Producer.bumped()
	p.Generation, p.Handoff = index, nil
	return nil
}

func (s *State) applyReleasePartition(c ReleasePartition, index uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.Handoff = nil
	if c.Checkpoint != nil {
		cp := *c.Checkpoint
		p.Handoff, p.Producer = &cp, cp.Producer
	}
	p.Owner = ""
	if m, ok := s.Members[p.MoveTo]; ok && !m.Draining {
		p.Owner = p.MoveTo
	}
	p.Generation, p.MoveTo = index, ""
	return nil
}

func (s *State) applyRequestMove(c RequestMove, _ uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if c.Generation != p.Generation {
		return fmt.Errorf("%w: partition %s is in generation %d, the move was decided in %d", ErrStaleGeneration, c.Key, p.Generation, c.Generation)
	}
	if _, ok := s.Members[c.To]; c.To != "" && !ok {
		return fmt.Errorf("%w: member %q", ErrNotFound, c.To)
	}
	p.MoveTo = c.To
	return nil
}

func (s *State) applyPartitionStopped(c PartitionStopped, index uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	t, _ := s.Topic(c.Key.Mirror, c.Key.Topic)
	if t.State != StateStopping {
		return fmt.Errorf("%w: topic %q is %s, not STOPPING", ErrInvalid, TopicKey(t.Mirror, t.Topic), t.State)
	}
	pos := c.Position
	p.LastMirrored, p.UnverifiedEnd, p.StoppedAtMs = &pos, c.UnverifiedEnd, c.AtMs
	p.LateBatches, p.LateRecords, p.LateEnd = nil, 0, 0
	// The topic's reason (an automatic failover says why) stays with it;
	// a partition stopped while DIVERGED or FAILED keeps why.
	was, why := p.State, p.Reason
	s.enter(p, StateStopped)
	p.Reason = t.Reason
	if c.Reason != "" {
		p.Reason = c.Reason
	}
	switch {
	case p.Reason != "" || why == "":
	case was == StateStopping && strings.HasPrefix(why, "stopped while "):
		p.Reason = why
	case was == StateDiverged || was == StateFailed:
		p.Reason = fmt.Sprintf("stopped while %s: %s", was, why)
	}
	p.Owner, p.Generation, p.MoveTo, p.Handoff = "", index, "", nil
	for _, q := range t.Partitions {
		if q.State != StateStopped {
			return nil
		}
	}
	t.State = StateStopped
	s.noteFailover(t, index)
	return nil
}

func (s *State) applySettleStopped(c SettleStopped, _ uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if p.State != StateStopped || p.UnverifiedEnd == 0 {
		return fmt.Errorf("%w: partition %s is %s with nothing left to verify", ErrInvalid, c.Key, p.State)
	}
	pos := c.Position
	p.LastMirrored, p.UnverifiedEnd, p.Reason = &pos, 0, c.Reason
	return nil
}

// maxLateBatches bounds PartitionInfo.LateBatches; LateRecords counts on.
const maxLateBatches = 16

func (s *State) applyRecordLateBatch(c RecordLateBatch, _ uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if p.State != StateStopped {
		return fmt.Errorf("%w: partition %s is %s, not STOPPED", ErrInvalid, c.Key, p.State)
	}
	if c.Batch.FirstOffset < p.LateEnd {
		return nil // counted already (a new leader scans again)
	}
	if len(p.LateBatches) < maxLateBatches {
		p.LateBatches = append(p.LateBatches, c.Batch)
	}
	p.LateRecords += int64(c.Batch.Records)
	p.LateEnd = c.Batch.LastOffset + 1
	return nil
}

func (s *State) applySetDraining(c SetDraining, _ uint64) error {
	m, ok := s.Members[c.ID]
	if !ok {
		return fmt.Errorf("%w: member %q", ErrNotFound, c.ID)
	}
	m.Draining = c.Draining
	return nil
}

func (s *State) applyRecordStopped(c RecordStopped, index uint64) error {
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	if len(c.Positions) != len(t.Partitions) {
		return fmt.Errorf("%w: topic %q has %d partitions, got %d positions", ErrInvalid, TopicKey(c.Mirror, c.Topic), len(t.Partitions), len(c.Positions))
	}
	t.State, t.Reason = StateStopped, ""
	for i := range t.Partitions {
		p := &t.Partitions[i]
		pos := c.Positions[i]
		p.LastMirrored = &pos
		p.State, p.Reason = StateStopped, ""
		// Releasing the owner is an assignment change: fence the old owner.
		p.Owner, p.Generation, p.MoveTo, p.Handoff = "", index, "", nil
	}
	return nil
}

func (s *State) applyUpsertMember(c UpsertMember, index uint64) error {
	if c.Member.ID == "" {
		return fmt.Errorf("%w: member ID is empty", ErrInvalid)
	}
	if _, ok := s.Members[c.Member.ID]; ok && c.IfAbsent {
		return nil
	}
	m := c.Member
	if old, ok := s.Members[m.ID]; ok && m.LeaseTTLMs == 0 {
		// An operator's repeated add, or an older build, does not know
		// the member's lease settings: keep what the member announced.
		m.LeaseTTLMs = old.LeaseTTLMs
		m.LeaseProtocol = old.LeaseProtocol
	}
	s.Members[m.ID] = &m
	return nil
}

func (s *State) applyRemoveMember(c RemoveMember, index uint64) error {
	if _, ok := s.Members[c.ID]; !ok {
		return fmt.Errorf("%w: member %q", ErrNotFound, c.ID)
	}
	delete(s.Members, c.ID)
	return nil
}

func (s *State) applyRemoveTopic(c RemoveTopic, index uint64) error {
	k := TopicKey(c.Mirror, c.Topic)
	if _, ok := s.Topics[k]; !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, k)
	}
	delete(s.Topics, k)
	s.dropGroupRestores(c.Mirror, c.Topic)
	return nil
}

func (s *State) applyAddPartitions(c AddPartitions, index uint64) error {
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	have := len(t.Partitions)
	if c.Partitions <= have {
		return nil
	}
	if len(c.StartOffsets) != c.Partitions-have {
		return fmt.Errorf("%w: topic %q grows from %d to %d partitions but %d start offsets were given",
			ErrInvalid, TopicKey(c.Mirror, c.Topic), have, c.Partitions, len(c.StartOffsets))
	}
	switch t.State {
	case StateStopping, StateStopped:
		return fmt.Errorf("%w: topic %q is %s", ErrInvalid, TopicKey(c.Mirror, c.Topic), t.State)
	}
	state := StateMirroring
	if t.State == StatePending || t.State == StatePaused {
		state = t.State
	}
	for _, off := range c.StartOffsets {
		t.Partitions = append(t.Partitions, PartitionInfo{State: state, StartOffset: off, Generation: index})
	}
	return nil
}

func (s *State) applySetTopicIDs(c SetTopicIDs, _ uint64) error {
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	if t.SourceTopicID == "" {
		t.SourceTopicID = c.SourceTopicID
	}
	if t.DestTopicID == "" {
		t.DestTopicID = c.DestTopicID
	}
	return nil
}

func (s *State) applyResumePartition(c ResumePartition, index uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	t, _ := s.Topic(c.Key.Mirror, c.Key.Topic)
	if t.State != StateMirroring && t.State != StateFailed {
		return fmt.Errorf("%w: topic %q is %s: only a mirroring topic's partitions resume", ErrInvalid, TopicKey(t.Mirror, t.Topic), t.State)
	}
	if p.State != StateDiverged && p.State != StateFailed {
		return fmt.Errorf("%w: partition %s is %s, not DIVERGED or FAILED: nothing to resume", ErrInvalid, c.Key, p.State)
	}
	s.enter(p, StateMirroring)
	p.Reason = ""
	p.AcceptGap, p.AcceptGapBelow = c.AcceptGap, c.AcceptGapBelow
	p.Generation, p.MoveTo, p.Handoff = index, "", nil
	return nil
}

func (s *State) applyRecordGap(c RecordGap, _ uint64) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if !p.AcceptGap {
		return fmt.Errorf("%w: partition %s has no permission to skip a gap (kmirror resume --accept-gap)", ErrInvalid, c.Key)
	}
	if c.To < c.From {
		return fmt.Errorf("%w: gap %d..%d of partition %s ends before it starts", ErrInvalid, c.From, c.To-1, c.Key)
	}
	p.AcceptGap, p.AcceptGapBelow = false, 0 // used up, also by a start that found no gap
	// The same range again (accepted, then the partition restarted from a
	// checkpoint before it): counted once.
	if gap := fmt.Sprintf("%d..%d", c.From, c.To-1); c.To > c.From && gap != p.LastGap {
		p.SkippedRecords += c.To - c.From
		p.LastGap = gap
	}
	return nil
}

func (s *State) applyDeferredApplied(c DeferredApplied, _ uint64) error {
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	for k, v := range t.DeferredConfigs {
		if t.DestinationConfigs != nil {
			t.DestinationConfigs[k] = v
		}
	}
	t.DeferredConfigs, t.DeferUntil = nil, nil
	return nil
}

func (s *State) partition(k PartitionKey) (*PartitionInfo, error) {
	if _, ok := s.Topic(k.Mirror, k.Topic); !ok {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(k.Mirror, k.Topic))
	}
	p, ok := s.Partition(k)
	if !ok {
		return nil, fmt.Errorf("%w: partition %s", ErrNotFound, k)
	}
	return p, nil
}

// checkLease refuses a partition-scoped command from a writer whose lease
// is not the partition's current one.
func checkLease(k PartitionKey, p *PartitionInfo, l Lease) error {
	if l.Owner == "" || l.Owner != p.Owner || l.Generation != p.Generation {
		return fmt.Errorf("%w: partition %s is leased to %q in generation %d, writer %q has generation %d",
			ErrStaleGeneration, k, p.Owner, p.Generation, l.Owner, l.Generation)
	}
	return nil
}

// bumped is the next epoch of the same producer ID, for a renewal after
// the broker refused the identity: the broker then refuses the old epoch's
// batches (INVALID_PRODUCER_EPOCH) for as long as it holds the producer's
// state. At the last epoch the identity is dropped and the owner allocates
// a new producer ID.
func (id ProducerIdentity) bumped() ProducerIdentity {
	if !id.Allocated || id.Epoch == math.MaxInt16 {
		return ProducerIdentity{}
	}
	id.Epoch++
	return id
}

func knownState(s TopicState) bool {
	switch s {
	case StatePending, StateMirroring, StatePaused, StateStopping, StateStopped, StateFailed, StateDiverged:
		return true
	}
	return false
}

// enter moves p to state, noting since when (the entry's append time)
// and counting failures; staying in the same state changes neither.
func (s *State) enter(p *PartitionInfo, state TopicState) {
	if p.State == state {
		return
	}
	p.State, p.StateSinceMs = state, s.appendedAtMs
	if state == StateFailed || state == StateDiverged {
		p.Failures++
	}
}
