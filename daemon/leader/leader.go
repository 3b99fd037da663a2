package leader

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// adminTimeout bounds each round's call to a Kafka cluster.
const adminTimeout = 15 * time.Second

// failoverCheckInterval is how often the leader decides on automatic
// failover (each member probes its sources as often).
const failoverCheckInterval = time.Second

// Store is the raft store as the leader's duties use it
// (*raftstore.Store).
type Store interface {
	// Leadership delivers true when this member becomes the raft leader
	// and false when it stops being it.
	Leadership() <-chan bool
	Barrier(ctx context.Context) error
	Watch() (<-chan struct{}, func())
	Read(func(*raftstore.State))
	// Apply applies a command as the leader; errors wrap raftstore's
	// sentinels.
	Apply(ctx context.Context, cmd raftstore.Command) error
	Servers() ([]raftstore.Server, error)
	// PeerContact is when the leader last heard from member id.
	PeerContact(id string) time.Time
	// LeaseGrant is when the leader last granted member id a lease in
	// this leadership (granted), else when it became leader.
	LeaseGrant(id string) (at time.Time, granted bool)
	// BeginTakeover stops lease grants to member id until end is called
	// (raftstore.Store.BeginTakeover).
	BeginTakeover(id string) (end func())
	// Clock is the clock grants and contact are stamped on: takeovers are
	// timed on it (raftstore.Clock).
	Clock() raftstore.Clock
	IsLeader() bool
}

// Member is what the leader's duties ask of the member they run on.
type Member interface {
	// AdvertisedHTTP is the address other members reach this one's API on.
	AdvertisedHTTP() string
	// FinishPending completes a PENDING topic: the second half of an
	// operator's add (its destination topic and configs).
	FinishPending(ctx context.Context, t raftstore.MirrorTopic)
	// SourceAdmin opens an admin client of a mirror's source cluster;
	// SourceKey changes when the mirror's connection settings do.
	SourceAdmin(mir raftstore.Mirror) *kafka.Admin
	SourceKey(mir raftstore.Mirror) string
	// Reaches is every member's view of each mirror's source and of the
	// destination (this member's too); members that do not answer in time
	// are left out.
	Reaches(ctx context.Context) map[string]api.Reach
	// FailoverAfter is the mirror's failover.auto.after.ms (0: off).
	FailoverAfter(mir raftstore.Mirror) time.Duration
	// DiscoverTopics adds the source topics a mirror's patterns match
	// that no mirror mirrors yet (ops.DiscoverTopics); DiscoveryInterval
	// is the mirror's topics.discovery.interval.
	DiscoverTopics(ctx context.Context, mirror string) (api.AddResult, error)
	DiscoveryInterval(mir raftstore.Mirror) time.Duration
	// SyncTopicConfigs copies changed source topic configs to a mirror's
	// topics (ops.SyncTopicConfigs); ConfigSyncInterval is the mirror's
	// topics.config.sync.interval.
	SyncTopicConfigs(ctx context.Context, mirror string) error
	ConfigSyncInterval(mir raftstore.Mirror) time.Duration
	// SettleUnverified verifies against the mirror's source the records a
	// stop of t's partition could not (PartitionInfo.UnverifiedEnd),
	// writes the position they reach to the state topic, and returns it
	// with the partition's reason from now on. An error leaves it to a
	// later try (the source does not answer yet).
	SettleUnverified(ctx context.Context, mir raftstore.Mirror, t raftstore.MirrorTopic, partition int32) (raftstore.Position, string, error)
	// Checkpointed is a partition's last checkpoint (fetch.Engine).
	Checkpointed(ctx context.Context, k fetch.Key) (pos fetch.Position, ok bool, err error)
}

// Config is what the leader's duties read of the member's configuration.
type Config struct {
	NodeID   string
	LeaseTTL time.Duration // a member not heard from for this long is taken over
	Peers    []config.PeerConfig
	// DestPrincipal is kmirror's principal on the destination, never
	// denied WRITE on mirror topics (read-only mirror topics).
	DestPrincipal string
	// HooksDir holds the executables failover.hook.exec names (hooks.go).
	HooksDir string
}

// Leader runs the raft leader's duties while this member leads: the
// members known, placement (PlanAssignments), pending topics, the topic
// watch, read-only mirror topics and automatic failover.
type Leader struct {
	cfg    Config
	store  Store
	dest   *kafka.Admin
	member Member
	log    *zap.Logger
	// ctx is the member's life; each leadership gets a child of it.
	ctx context.Context

	readOnly      readOnly
	autoFailovers counter
	// probeAnswered is how many members (this one included) answered the
	// last round of the automatic failover's reachability probe, and
	// probeMembers how many the group has; probeKnown: a round ran.
	probeMu                     sync.Mutex
	probeAnswered, probeMembers int
	probeKnown                  bool
	// hookRetryAt holds, by hook run ID, when an attempt this leader could
	// not record may be made again (time.Time).
	hookRetryAt sync.Map
	// hookGaveUp counts, per mirror, the hook runs this leader gave up.
	hookGaveUp counter
	// hookAttempts counts failover hook attempts by mirror and outcome
	// ("mirror\x00ok" or "mirror\x00error").
	hookAttempts counter

	// stuck holds the members that cannot reach a mirror's source while
	// others can, destStuck those the destination does not answer while
	// it answers others, each with why (noteStuck).
	stuckMu   sync.Mutex
	stuck     map[[2]string]string
	destStuck map[string]string
	// cooling holds the (member, mirror) pairs (mirror "" for the
	// destination) that stopped being stuck recently: they get no
	// partitions until the cooldown ends (noteStuck).
	cooling map[[2]string]cooldown
	// now is the clock of the cooldowns (nil: time.Now; tests set it).
	now func() time.Time

	// settleWarned is when settleUnverified last warned about each mirror
	// (settleLoop's goroutine only).
	settleWarned map[string]time.Time
}

// New returns the leader duties of a member; Run starts them.
func New(ctx context.Context, cfg Config, store Store, dest *kafka.Admin, member Member, log *zap.Logger) *Leader {
	return &Leader{cfg: cfg, store: leaderStore{store}, dest: dest, member: member, log: log, ctx: ctx}
}

// leaderStore applies only the commands the command table lets the leader
// submit (raftstore.Authorize).
type leaderStore struct{ Store }

func (s leaderStore) Apply(ctx context.Context, cmd raftstore.Command) error {
	if err := raftstore.Authorize(cmd, raftstore.ByLeader); err != nil {
		return err
	}
	return s.Store.Apply(ctx, cmd)
}

// ReadOnlyGauges returns kmirror_read_only_unprotected_topics and
// kmirror_read_only_unlifted_topics; ok is false on a member that has not
// led a round.
func (l *Leader) ReadOnlyGauges() (unprotected, unlifted int, ok bool) { return l.readOnly.gauges() }

// AutoFailovers counts, per mirror, the automatic failovers this member
// decided as leader.
func (l *Leader) AutoFailovers() map[string]int64 { return l.autoFailovers.snapshot() }

// noteProbe records how many members answered a probe round.
func (l *Leader) noteProbe(answered int) {
	members := 0
	l.store.Read(func(s *raftstore.State) { members = len(s.Members) })
	l.probeMu.Lock()
	defer l.probeMu.Unlock()
	l.probeAnswered, l.probeMembers, l.probeKnown = answered, members, true
}

// ProbeMembers returns, while this member leads, how many members answered
// the last round of the reachability probe that automatic failover and
// placement decide on, and how many members the group has; ok is false on
// a member that does not lead or has not run a round. A member that does
// not answer counts as reaching every source, so it can never trigger an
// automatic failover.
func (l *Leader) ProbeMembers() (answered, members int, ok bool) {
	if !l.store.IsLeader() {
		return 0, 0, false
	}
	l.probeMu.Lock()
	defer l.probeMu.Unlock()
	return l.probeAnswered, l.probeMembers, l.probeKnown
}

// HookAttempts counts, per mirror and outcome ("ok", "error"), the failover
// hook attempts this member made as leader, and per mirror the runs it gave
// up; while it leads, every mirror with a hook has both outcomes and a
// give-up count, 0 until one happens (so an alert's increase() sees the
// first).
func (l *Leader) HookAttempts() (attempts map[[2]string]int64, gaveUp map[string]int64) {
	attempts, gaveUp = map[[2]string]int64{}, l.hookGaveUp.snapshot()
	if l.store.IsLeader() {
		l.store.Read(func(s *raftstore.State) {
			for name, m := range s.Mirrors {
				if m.HasFailoverHook() {
					attempts[[2]string{name, "ok"}] += 0
					attempts[[2]string{name, "error"}] += 0
					gaveUp[name] += 0
				}
			}
		})
	}
	for k, n := range l.hookAttempts.snapshot() {
		mirror, outcome, _ := strings.Cut(k, "\x00")
		attempts[[2]string{mirror, outcome}] = n
	}
	return attempts, gaveUp
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
