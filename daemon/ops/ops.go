package ops

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// adminTimeout bounds each call to a Kafka cluster made for an API
// request; api.AddTimeout counts on it.
const adminTimeout = api.AdminStepTimeout

// Store is the raft store as the operator verbs use it (*raftstore.Store).
// Errors wrap raftstore's sentinels (StoreErr maps them to the API's).
type Store interface {
	Read(func(*raftstore.State))
	Watch() (<-chan struct{}, func())
	// Apply applies a command as the leader.
	Apply(ctx context.Context, cmd raftstore.Command) error
	// Leader is the raft leader's address and ID ("" when none is known).
	Leader() (addr, id string)
	Servers() ([]raftstore.Server, error)
	AddVoter(id, addr string) error
	AddNonvoter(id, addr string) error
	RemoveServer(id string) error
	// PeerContact is when the leader last heard from member id;
	// PeerFailing whether raft's replication to it fails; PeerDialError
	// why a raft address cannot be dialled (nil: it can).
	PeerContact(id string) time.Time
	PeerFailing(id string) bool
	// LeaseGrant is when the leader last granted member id a lease in
	// this leadership (granted), else when it became leader.
	LeaseGrant(id string) (at time.Time, granted bool)
	// Clock is the clock PeerContact and LeaseGrant are stamped on
	// (raftstore.Clock).
	Clock() raftstore.Clock
	PeerDialError(addr string) error
}

// Engine is this member's data path as the verbs use it (*fetch.Engine).
type Engine interface {
	// Checkpointed is a partition's last checkpoint.
	Checkpointed(ctx context.Context, k fetch.Key) (pos fetch.Position, ok bool, err error)
	// Translate maps a source offset to the destination offset a consumer
	// continues at (design.md section 5).
	Translate(k fetch.Key, sourceOffset int64) (int64, error)
	// ForgetTopic deletes a topic's checkpoints and translation.
	ForgetTopic(ctx context.Context, mirror, topic string) error
	// Seed starts a partition's progress at a position found on the
	// destination (re-add over an existing topic).
	Seed(ctx context.Context, k fetch.Key, at fetch.Entry, leaderEpoch int32, entries []fetch.Entry) error
	// RecordActive writes (nil value: deletes) a topic's active record in
	// the destination's state topic (truncate.ActiveMirror).
	RecordActive(ctx context.Context, mirror, topic string, value []byte) error
}

// Leader is the leader's duties as the verbs use them (*leader.Leader).
type Leader interface {
	// Alive reports which members the leader counts as alive, and which
	// are in the raft configuration.
	Alive() (alive func(id string) bool, inConfig map[string]bool)
	// LiftReadOnly runs a read-only round now: it returns once the DENY
	// WRITE ACLs of stopped topics are gone (or it gave up).
	LiftReadOnly(ctx context.Context)
	// LiftStopFence deletes the DENY WRITE ACL for kmirror's own
	// principal that a stop put on topic, before an add of it.
	// Until done is called the topic is not fenced again.
	LiftStopFence(ctx context.Context, topic string) (done func(), err error)
}

// Member is what the verbs ask of the member they run on: reaching the
// leader and the other members, and its read barrier.
type Member interface {
	// ToLeader returns nil when this member leads and serves a write
	// itself, else a client of the leader to forward it to (errors wrap
	// api.ErrNotLeader).
	ToLeader(ctx context.Context) (*api.Client, error)
	// MemberClient is a client of member id for a forwarded request.
	MemberClient(id string) (*api.Client, error)
	// LiveStatuses is what every member's data path reports now, by
	// partition; members that did not answer in time are in silent.
	LiveStatuses(ctx context.Context) (out map[fetch.Key]api.LiveStatus, silent map[string]bool)
	// GroupRows is every member's group offset sync rows; members that
	// did not answer in time are in silent.
	GroupRows(ctx context.Context) (rows []api.GroupStatus, silent map[string]bool)
	// CaughtUp is nil once this member's state has applied what the
	// leader had (a read index).
	CaughtUp(ctx context.Context) error
	// SourceAdmin opens an admin client of a mirror's source cluster; the
	// caller closes it.
	SourceAdmin(mir raftstore.Mirror) *kafka.Admin
}

// Config is what the verbs read of the member's configuration.
type Config struct {
	NodeID string
	// ClientID is the member's Kafka client.id.
	ClientID string
	// ReplicationFactor is the destination topics' replication factor
	// when an add gives none (-1: the broker's default).
	ReplicationFactor int16
}

// Ops serves the operator's verbs (api.Service but Ready) on the leader:
// a follower forwards each write to it (Member.ToLeader), and reads wait
// for the member's state to catch up (Member.CaughtUp).
type Ops struct {
	cfg    Config
	store  Store
	dest   *kafka.Admin
	engine Engine
	lead   Leader
	member Member
	log    *zap.Logger

	// creating holds the topics an API request is creating right now, so
	// the leader loop does not finish them as leftovers concurrently.
	creatingMu sync.Mutex
	creating   map[string]bool
	// adding holds the topics an add is between writing their active
	// record and recording them (reconcileActive leaves those alone).
	adding map[string]int
	// pendingTried is when the leader last tried to create the
	// destination topic of a PENDING topic (FinishPending).
	pendingTried map[string]time.Time
}

// New returns the operator verbs of a member; dest is the destination
// cluster.
func New(cfg Config, store Store, dest *kafka.Admin, engine Engine, lead Leader, member Member, log *zap.Logger) *Ops {
	return &Ops{cfg: cfg, store: operatorStore{store}, dest: dest, engine: engine, lead: lead, member: member, log: log,
		creating: map[string]bool{}, adding: map[string]int{}, pendingTried: map[string]time.Time{}}
}

// markCreating marks topic key as being created by an API request, so the
// leader's FinishPending leaves it alone; the returned func unmarks it.
func (o *Ops) markCreating(key string) (done func()) {
	o.creatingMu.Lock()
	o.creating[key] = true
	o.creatingMu.Unlock()
	return func() {
		o.creatingMu.Lock()
		delete(o.creating, key)
		o.creatingMu.Unlock()
	}
}

// markAdding marks topic key as being added (addPlanned); the returned
// func unmarks it.
func (o *Ops) markAdding(key string) (done func()) {
	o.creatingMu.Lock()
	o.adding[key]++
	o.creatingMu.Unlock()
	return func() {
		o.creatingMu.Lock()
		if o.adding[key]--; o.adding[key] <= 0 {
			delete(o.adding, key)
		}
		o.creatingMu.Unlock()
	}
}

// isAdding reports whether an add of topic key runs now.
func (o *Ops) isAdding(key string) bool {
	o.creatingMu.Lock()
	defer o.creatingMu.Unlock()
	return o.adding[key] > 0
}

// operatorStore applies only the commands the command table lets an
// operator submit (raftstore.Authorize), whatever a verb builds.
type operatorStore struct{ Store }

func (s operatorStore) Apply(ctx context.Context, cmd raftstore.Command) error {
	if err := raftstore.Authorize(cmd, raftstore.ByOperator); err != nil {
		return err
	}
	return s.Store.Apply(ctx, cmd)
}

// StoreErr turns raftstore's sentinel errors (ErrNotFound, ErrExists,
// ErrNotLeader, ErrStaleGeneration, ErrInvalid) into the API's, keeping
// the message; other errors pass unchanged.
func StoreErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raftstore.ErrNotFound):
		return fmt.Errorf("%w: %v", api.ErrNotFound, err)
	case errors.Is(err, raftstore.ErrExists):
		return fmt.Errorf("%w: %v", api.ErrExists, err)
	case errors.Is(err, raftstore.ErrNotLeader):
		return fmt.Errorf("%w: %v", api.ErrNotLeader, err)
	case errors.Is(err, raftstore.ErrStaleGeneration):
		return fmt.Errorf("%w: %v", api.ErrStale, err)
	case errors.Is(err, raftstore.ErrInvalid):
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	return err
}
