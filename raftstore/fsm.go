package raftstore

import (
	"errors"
	"fmt"
	"io"
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
		resp = f.state.apply(cmd)
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

func (s *State) apply(cmd Command) error {
	switch c := cmd.(type) {
	case CreateMirror:
		return s.applyCreateMirror(c)
	case DeleteMirror:
		return s.applyDeleteMirror(c)
	case AddTopic:
		return s.applyAddTopic(c)
	case SetTopicState:
		return s.applySetTopicState(c)
	case SetPartitionState:
		return s.applySetPartitionState(c)
	case Assign:
		return s.applyAssign(c)
	case SetProducer:
		return s.applySetProducer(c)
	case RecordStopped:
		return s.applyRecordStopped(c)
	case UpsertMember:
		return s.applyUpsertMember(c)
	case RemoveMember:
		return s.applyRemoveMember(c)
	case RemoveTopic:
		return s.applyRemoveTopic(c)
	}
	// Decode returned a type this switch lacks: a bug in this file.
	panic(fmt.Sprintf("raftstore: no apply method for %s", cmd.Type()))
}

func (s *State) applyCreateMirror(c CreateMirror) error {
	name := c.Mirror.Name
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%w: mirror name %q must be non-empty and contain no '/'", ErrInvalid, name)
	}
	if _, ok := s.Mirrors[name]; ok {
		return fmt.Errorf("%w: mirror %q", ErrExists, name)
	}
	s.Mirrors[name] = c.Mirror.Clone()
	return nil
}

func (s *State) applyDeleteMirror(c DeleteMirror) error {
	if _, ok := s.Mirrors[c.Name]; !ok {
		return fmt.Errorf("%w: mirror %q", ErrNotFound, c.Name)
	}
	delete(s.Mirrors, c.Name)
	for k, t := range s.Topics {
		if t.Mirror == c.Name {
			delete(s.Topics, k)
		}
	}
	return nil
}

func (s *State) applyAddTopic(c AddTopic) error {
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
	if _, ok := s.Topic(t.Mirror, t.Topic); ok {
		return fmt.Errorf("%w: topic %q", ErrExists, TopicKey(t.Mirror, t.Topic))
	}
	s.Topics[TopicKey(t.Mirror, t.Topic)] = t.Clone()
	return nil
}

func (s *State) applySetTopicState(c SetTopicState) error {
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
		if p.State != StateDiverged {
			p.State, p.Reason = c.State, c.Reason
		}
	}
	return nil
}

func (s *State) applySetPartitionState(c SetPartitionState) error {
	if !knownState(c.State) {
		return fmt.Errorf("%w: unknown partition state %q", ErrInvalid, c.State)
	}
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.State, p.Reason = c.State, c.Reason
	return nil
}

func (s *State) applyAssign(c Assign) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	p.Owner = c.Owner
	p.Generation++
	return nil
}

func (s *State) applySetProducer(c SetProducer) error {
	p, err := s.partition(c.Key)
	if err != nil {
		return err
	}
	if c.Generation != p.Generation {
		return fmt.Errorf("%w: partition %s is in generation %d, writer has %d", ErrStaleGeneration, c.Key, p.Generation, c.Generation)
	}
	p.Producer = c.Producer
	return nil
}

func (s *State) applyRecordStopped(c RecordStopped) error {
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
		if p.Owner != "" {
			p.Owner = ""
			p.Generation++
		}
	}
	return nil
}

func (s *State) applyUpsertMember(c UpsertMember) error {
	if c.Member.ID == "" {
		return fmt.Errorf("%w: member ID is empty", ErrInvalid)
	}
	m := c.Member
	s.Members[m.ID] = &m
	return nil
}

func (s *State) applyRemoveMember(c RemoveMember) error {
	if _, ok := s.Members[c.ID]; !ok {
		return fmt.Errorf("%w: member %q", ErrNotFound, c.ID)
	}
	delete(s.Members, c.ID)
	return nil
}

func (s *State) applyRemoveTopic(c RemoveTopic) error {
	k := TopicKey(c.Mirror, c.Topic)
	if _, ok := s.Topics[k]; !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, k)
	}
	delete(s.Topics, k)
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

func knownState(s TopicState) bool {
	switch s {
	case StatePending, StateMirroring, StatePaused, StateStopping, StateStopped, StateFailed, StateDiverged:
		return true
	}
	return false
}
