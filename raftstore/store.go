package raftstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.uber.org/zap"
)

// ErrNotLeader is returned by writes made on a member that is not the raft
// leader; the command was not applied. Send it to the leader (Leader).
var ErrNotLeader = errors.New("not the raft leader")

const (
	retainSnapshots = 2
	logCacheSize    = 512
	tcpMaxPool      = 3
	// tcpTimeout bounds each raft RPC, so a stopped peer shows up as a
	// failed heartbeat within seconds (see PeerContact).
	tcpTimeout = 2 * time.Second
	// boltOpenTimeout bounds the wait for bolt's file lock, so a second
	// daemon on the same DataDir fails instead of hanging.
	boltOpenTimeout = time.Second
)

// Config configures a Store.
type Config struct {
	// NodeID is this member's raft server ID, unique in the group.
	NodeID string
	// RaftAddr is the host:port the raft TCP transport advertises; it must
	// be dialable by the other members.
	RaftAddr string
	// BindAddr is where the transport listens; empty means RaftAddr.
	BindAddr string
	// TLS secures the transport with mutual TLS; nil: plain TCP.
	TLS *TLS
	// DataDir holds raft.db (log and stable store) and the snapshots.
	DataDir string
	// Bootstrap forms a new group when DataDir has no raft state yet: with
	// Peers as its configuration, or this member alone when Peers is
	// empty. Every member of a new group bootstraps with the same Peers,
	// which raft allows. Ignored when state exists.
	Bootstrap bool
	Peers     []Server
	// Logger receives raft's logs under "raft"; nil discards them.
	Logger *zap.Logger
	// Transport replaces the TCP transport on RaftAddr (tests use raft's
	// in-memory transport). The Store closes it on Close.
	Transport raft.Transport
	// Zero means raft's default.
	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// InMemory keeps the log and snapshots in memory (tests); DataDir is
	// then unused.
	InMemory bool
	// Clock times leadership changes, lease grants and contact for the
	// lease; nil: the process clock (tests run members on clocks of other
	// rates).
	Clock Clock
}

// Validate reports the first setting that cannot work, naming the field.
func (c Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("raftstore: NodeID is empty; set it to this member's unique ID")
	case c.DataDir == "" && !c.InMemory:
		return errors.New("raftstore: DataDir is empty; set the directory for the raft log and snapshots")
	case c.RaftAddr == "" && c.Transport == nil:
		return errors.New("raftstore: RaftAddr is empty; set the host:port other members reach this one on")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"HeartbeatTimeout", c.HeartbeatTimeout},
		{"ElectionTimeout", c.ElectionTimeout},
		{"LeaderLeaseTimeout", c.LeaderLeaseTimeout},
		{"CommitTimeout", c.CommitTimeout},
	} {
		if d.v < 0 {
			return fmt.Errorf("raftstore: %s is %s; it must be positive, or 0 for raft's default", d.name, d.v)
		}
	}
	if err := raft.ValidateConfig(c.raftConfig()); err != nil {
		return fmt.Errorf("raftstore: %w", err)
	}
	return nil
}

func (c Config) raftConfig() *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(c.NodeID)
	if c.HeartbeatTimeout > 0 {
		rc.HeartbeatTimeout = c.HeartbeatTimeout
	}
	if c.ElectionTimeout > 0 {
		rc.ElectionTimeout = c.ElectionTimeout
	}
	if c.LeaderLeaseTimeout > 0 {
		rc.LeaderLeaseTimeout = c.LeaderLeaseTimeout
	}
	if c.CommitTimeout > 0 {
		rc.CommitTimeout = c.CommitTimeout
	}
	// Pre-vote stays on (raft's default, pinned against a change of
	// default): a member cut off and coming back, or one whose answers are
	// late, asks whether it could win before it raises the term, so it does
	// not depose a healthy leader. A needless election costs every member
	// its lease (a new leader counts takeovers from its election, and
	// members renew with it) and the group a pause in writes (design.md
	// section 3).
	rc.PreVoteDisabled = false
	return rc
}

// Server is one member of the raft configuration.
type Server struct {
	ID    string
	Addr  string
	Voter bool
}

// Store is one member's replica of the control-plane state: the FSM behind
// hashicorp/raft, with raft-boltdb as log and stable store.
type Store struct {
	log  *zap.Logger
	fsm  *FSM
	raft *raft.Raft
	bolt *raftboltdb.BoltStore // nil when InMemory

	leadership chan bool
	obs        *raft.Observer
	stream     *streamLayer           // nil with a test transport
	netTrans   *raft.NetworkTransport // the transport over stream
	obsCh      chan raft.Observation

	mu sync.Mutex
	// leaderSince is when this member last became leader; leftLeadership
	// when it last stopped being leader.
	leaderSince, leftLeadership time.Time
	// failing holds, for each peer whose heartbeats fail, the last time
	// the leader heard from it (zero: never since it became leader).
	failing map[string]time.Time
	// grants holds, on the leader, when it last granted each member a
	// lease during this leadership (RecordLeaseGrant).
	grants map[string]time.Time
	// takingOver counts, on the leader, the takeovers of each member's
	// partitions being applied (BeginTakeover): no lease is granted to
	// the member meanwhile.
	takingOver map[string]int
	// barrierTerm is the raft term of the last Barrier that completed: in
	// it, this leader had applied every entry of earlier terms
	// (LeaderCaughtUp).
	barrierTerm atomic.Uint64
	closed      chan struct{}
	clock       Clock

	closeOnce sync.Once
	closeErr  error
}

// Apply replicates cmd and applies it. It returns ErrNotLeader on a
// follower, the command's own error (ErrNotFound, ErrExists, ...) if the
// FSM refused it, or ctx's error. A raft.ErrLeadershipLost error means the
// outcome is unknown: read the state before retrying.
func (s *Store) Apply(ctx context.Context, cmd Command) error {
	b, err := Encode(cmd)
	if err != nil {
		return err
	}
	timeout, err := timeoutOf(ctx)
	if err != nil {
		return err
	}
	f := s.raft.Apply(b, timeout)
	if err := s.wait(ctx, f); err != nil {
		return fmt.Errorf("apply %s: %w", cmd.Type(), err)
	}
	if err, ok := f.Response().(error); ok {
		return err
	}
	return nil
}

// Barrier waits until every command committed before it is applied to the
// local state. Only the leader can issue it.
func (s *Store) Barrier(ctx context.Context) error {
	timeout, err := timeoutOf(ctx)
	if err != nil {
		return err
	}
	term := s.raft.CurrentTerm()
	if err := s.wait(ctx, s.raft.Barrier(timeout)); err != nil {
		return fmt.Errorf("raft barrier: %w", err)
	}
	if s.raft.CurrentTerm() == term {
		s.barrierTerm.Store(term)
	}
	return nil
}

// LeaderCaughtUp reports whether this member leads and has applied every
// entry committed before its term (a Barrier completed in this term): a
// new leader's state can lag entries an earlier leader committed until
// then, so what it grants against its state must wait for it (issue 19).
func (s *Store) LeaderCaughtUp() bool {
	return s.IsLeader() && s.barrierTerm.Load() == s.raft.CurrentTerm()
}

// VerifyLeader checks with a quorum that this member is still the leader:
// nil means no other leader was elected before the call began. It returns
// ErrNotLeader, or ctx's error when the quorum does not answer in time.
func (s *Store) VerifyLeader(ctx context.Context) error {
	return s.wait(ctx, s.raft.VerifyLeader())
}

// TransferLeadership hands raft leadership to the most up-to-date other
// voter (raft's LeadershipTransfer, the leadership transfer extension of
// the raft thesis §3.10) and waits until that voter took over or ctx ends.
// A member that stops while it is leader calls it so the group elects no
// one by timeout: followers renew their leases through the leader's API,
// and a leader that stops serving it would let every lease run out.
// It returns ErrNotLeader when this member is not the leader, raft's error
// when there is no other voter, or ctx's error.
func (s *Store) TransferLeadership(ctx context.Context) error {
	if s.raft.State() != raft.Leader {
		return s.mapErr(raft.ErrNotLeader)
	}
	return s.wait(ctx, s.raft.LeadershipTransfer())
}

// FSM is the state machine (benchmarks snapshot and restore it directly).
func (s *Store) FSM() *FSM { return s.fsm }

// Read calls fn with the local state under a read lock; see FSM.Read.
func (s *Store) Read(fn func(*State)) { s.fsm.Read(fn) }

// Watch notifies on every change of the local state; see FSM.Watch.
func (s *Store) Watch() (<-chan struct{}, func()) { return s.fsm.Watch() }

// Clock is the clock this member's lease is timed on (Config.Clock).
func (s *Store) Clock() Clock { return s.clock }

// IsLeader reports whether this member currently is the raft leader.
func (s *Store) IsLeader() bool { return s.raft.State() == raft.Leader }

// Leadership delivers true when this member becomes leader and false when
// it stops being leader, every change in order (raft's NotifyCh). Only one
// goroutine should read it; it is closed by Close.
func (s *Store) Leadership() <-chan bool { return s.leadership }

// watch follows raft's leadership notifications until Close.
func (s *Store) watch(notify <-chan bool) {
	defer close(s.leadership)
	for {
		select {
		case leader, ok := <-notify:
			if !ok {
				return
			}
			now := s.clock.Now()
			s.mu.Lock()
			if leader {
				s.leaderSince = now
				clear(s.failing)
				clear(s.grants)
			} else {
				s.leftLeadership = now
			}
			s.mu.Unlock()
			select {
			case s.leadership <- leader:
			case <-s.closed:
				return
			}
		case <-s.closed:
			return
		}
	}
}

// watchHeartbeats follows raft's heartbeat observations until Close. Its
// observer blocks raft rather than drop one (a dropped
// ResumedHeartbeatObservation left a live peer failing for good, and with
// it refused every lease: issue 19), so this loop does nothing but update
// the map under s.mu.
func (s *Store) watchHeartbeats() {
	for {
		select {
		case o := <-s.obsCh:
			s.mu.Lock()
			switch d := o.Data.(type) {
			case raft.FailedHeartbeatObservation:
				last := d.LastContact
				if !last.IsZero() {
					last = s.clock.Local(last)
				}
				s.failing[string(d.PeerID)] = last
			case raft.ResumedHeartbeatObservation:
				delete(s.failing, string(d.PeerID))
			}
			s.mu.Unlock()
		case <-s.closed:
			return
		}
	}
}

// PeerContact is, on the leader, when it last heard from peer id: now for
// a peer whose heartbeats succeed, the last success for one whose
// heartbeats fail, and the time this member became leader if it never
// reached the peer since. Liveness comes from raft's own heartbeats
// (FailedHeartbeatObservation), not from a second protocol.
func (s *Store) PeerContact(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, failing := s.failing[id]
	if !failing {
		return s.clock.Now()
	}
	if last.Before(s.leaderSince) {
		return s.leaderSince
	}
	return last
}

// PeerFailing reports whether, on the leader, heartbeats to peer id are
// failing right now (it may still be within its lease).
func (s *Store) PeerFailing(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, failing := s.failing[id]
	return failing
}

// RecordLeaseGrant notes, on the leader, that it grants member id a lease
// at at, and reports whether it may: not while a takeover of the member's
// partitions is being applied (BeginTakeover). A grant the leader has
// decided to give is only given once recorded here.
func (s *Store) RecordLeaseGrant(id string, at time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.takingOver[id] > 0 {
		return false
	}
	if s.grants == nil {
		s.grants = map[string]time.Time{}
	}
	if at.After(s.grants[id]) {
		s.grants[id] = at
	}
	return true
}

// BeginTakeover marks, on the leader, that partitions of member id are
// about to be taken over, and returns the call that ends the mark (once
// the takeover's entry is applied, or dropped). While marked, the member
// is granted no lease (RecordLeaseGrant). The leader decides a takeover
// on the member's last grant, but applies it a raft round trip later: a
// grant in between, counted from before the takeover was committed and
// carrying a state index before it, let the member write partitions
// already given to another (seen in the tier test: 0.5 s of overlap).
// So the leader marks first, then checks the member's lease once more:
// a grant recorded before the mark is seen by that check, and none is
// recorded after it until the takeover is applied.
func (s *Store) BeginTakeover(id string) (end func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.takingOver == nil {
		s.takingOver = map[string]int{}
	}
	s.takingOver[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.takingOver[id]--; s.takingOver[id] <= 0 {
				delete(s.takingOver, id)
			}
		})
	}
}

// LeaseGrant is, on the leader, when it last granted member id a lease
// during this leadership, or the time it became leader when it has not
// (granted false). A member's lease never outlives the last grant it got
// plus lease_ttl - lease_margin, from any leader: a new leader that counts
// from its own election waits out the old leader's grants (design.md
// section 3).
func (s *Store) LeaseGrant(id string) (at time.Time, granted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g, ok := s.grants[id]; ok {
		return g, true
	}
	return s.leaderSince, false
}

// LeaseContact is the last moment this member is known to have been part
// of the group with a leader: now while it is leader (raft's leader steps
// down once it loses a quorum for LeaderLeaseTimeout), else the later of
// the leader's last contact and the time this member stopped leading. A
// member writes its partitions only while LeaseContact is recent (design.md
// section 3, self-fencing).
func (s *Store) LeaseContact() time.Time {
	if s.raft.State() == raft.Leader {
		return s.clock.Now()
	}
	lc := s.raft.LastContact()
	if !lc.IsZero() {
		lc = s.clock.Local(lc)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leftLeadership.After(lc) {
		return s.leftLeadership
	}
	return lc
}

// Servers returns the raft configuration: every member with its address
// and whether it votes.
func (s *Store) Servers() ([]Server, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("read raft configuration: %w", err)
	}
	var out []Server
	for _, srv := range f.Configuration().Servers {
		out = append(out, Server{ID: string(srv.ID), Addr: string(srv.Address), Voter: srv.Suffrage == raft.Voter})
	}
	return out, nil
}

// PeerDialError returns why this member's last raft connection to addr
// failed (refused, a TLS handshake or certificate error, a read that timed
// out or was refused by the member's TLS), or nil once data arrives from
// it again. Nil with a test transport.
func (s *Store) PeerDialError(addr string) error {
	if s.stream == nil {
		return nil
	}
	return s.stream.dialErr(raft.ServerAddress(addr))
}

// SetIsolated cuts (or restores) all of this member's raft traffic while
// everything else keeps running: a test hook for self-fencing tests. It
// fails with a test transport.
func (s *Store) SetIsolated(on bool) error {
	if s.stream == nil {
		return errors.New("raftstore: isolation needs the TCP transport")
	}
	s.stream.setCut(on)
	s.log.Warn("raft isolation test hook", zap.Bool("isolated", on))
	return nil
}

// AddNonvoter adds (or updates) a member that replicates the state but
// does not vote. Leader only.
func (s *Store) AddNonvoter(id, addr string) error {
	err := s.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 0).Error()
	if err != nil {
		return fmt.Errorf("add non-voter %s at %s: %w", id, addr, s.mapErr(err))
	}
	return nil
}

// Leader returns the raft address and ID of the current leader, or empty
// strings when none is known.
func (s *Store) Leader() (addr, id string) {
	a, i := s.raft.LeaderWithID()
	return string(a), string(i)
}

// LastContact is when this member last heard from the leader (zero if
// never; the leader reports the current time).
func (s *Store) LastContact() time.Time { return s.raft.LastContact() }

// AppliedIndex is the last raft index handed to the FSM.
func (s *Store) AppliedIndex() uint64 { return s.raft.AppliedIndex() }

// CommitIndex is the latest log index this member knows committed.
func (s *Store) CommitIndex() uint64 { return s.raft.CommitIndex() }

// Stats returns raft's diagnostic counters.
func (s *Store) Stats() map[string]string { return s.raft.Stats() }

// WaitForLeader returns once this member knows a leader, or ctx's error.
func (s *Store) WaitForLeader(ctx context.Context) error {
	changed := make(chan raft.Observation, 1)
	obs := raft.NewObserver(changed, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	s.raft.RegisterObserver(obs)
	defer s.raft.DeregisterObserver(obs)
	for {
		if addr, _ := s.Leader(); addr != "" {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for raft leader: %w", ctx.Err())
		}
	}
}

// AddVoter adds (or updates) a voting member. Leader only.
func (s *Store) AddVoter(id, addr string) error {
	err := s.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 0).Error()
	if err != nil {
		return fmt.Errorf("add voter %s at %s: %w", id, addr, s.mapErr(err))
	}
	return nil
}

// RemoveServer removes a member from the raft configuration. Leader only.
func (s *Store) RemoveServer(id string) error {
	if err := s.raft.RemoveServer(raft.ServerID(id), 0, 0).Error(); err != nil {
		return fmt.Errorf("remove server %s: %w", id, s.mapErr(err))
	}
	return nil
}

// Close stops raft, its transport and the log store. Safe to call twice.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.raft.DeregisterObserver(s.obs)
		err := s.raft.Shutdown().Error()
		if s.netTrans != nil {
			// raft's Shutdown leaves its transport open: close the
			// listener, then every connection, so no goroutine waits on
			// a peer.
			err = errors.Join(err, s.netTrans.Close())
			s.stream.setCut(true)
		}
		close(s.closed)
		if s.bolt != nil {
			err = errors.Join(err, s.bolt.Close())
		}
		s.closeErr = err
		s.log.Info("raft stopped")
	})
	return s.closeErr
}

// wait waits for f or ctx. raft futures always resolve (commit, lost
// leadership or shutdown), so the waiting goroutine never leaks for long.
func (s *Store) wait(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return s.mapErr(err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// mapErr turns raft's "not leader" refusals, where nothing was applied,
// into ErrNotLeader naming the leader to use instead.
func (s *Store) mapErr(err error) error {
	if !errors.Is(err, raft.ErrNotLeader) && !errors.Is(err, raft.ErrLeadershipTransferInProgress) {
		return err
	}
	addr, id := s.Leader()
	if addr == "" {
		return fmt.Errorf("%w (no leader known yet; retry shortly)", ErrNotLeader)
	}
	return fmt.Errorf("%w (leader is %s at %s)", ErrNotLeader, id, addr)
}

// timeoutOf converts ctx's deadline into a raft timeout (0 = none).
func timeoutOf(ctx context.Context) (time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	d, ok := ctx.Deadline()
	if !ok {
		return 0, nil
	}
	t := time.Until(d)
	if t <= 0 {
		return 0, context.DeadlineExceeded
	}
	return t, nil
}
