package owner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// Store is the raft store as an owner uses it (*raftstore.Store).
type Store interface {
	Read(func(*raftstore.State))
	Watch() (<-chan struct{}, func())
	// LeaseContact is when this member last heard from the raft leader:
	// the start of its write window under a leader of an older build,
	// which grants no leases (renew.go).
	LeaseContact() time.Time
	// Leader is the raft leader's address and ID ("" when none is known).
	Leader() (addr, id string)
	// Clock is this member's clock: the lease's times are read on it
	// (raftstore.Clock).
	Clock() raftstore.Clock
}

// Member is what the owner duties ask of the member they run on.
type Member interface {
	// Submit applies a command through the leader; errors wrap the api
	// sentinels (ErrStale, ErrInvalid, ErrNotFound, ErrExists: refused,
	// do not retry; others: retry).
	Submit(ctx context.Context, cmd raftstore.Command) error
	// CaughtUp is nil once this member's state has applied what the
	// leader had (a read index).
	CaughtUp(ctx context.Context) error
	// RenewLease asks the raft leader for this member's lease (renew.go);
	// api.ErrNotFound: the leader is of an older build without grants.
	RenewLease(ctx context.Context) (api.LeaseGrant, error)
	// AdvertisedHTTP and Self are this member's addresses and peers
	// entry, for its record in the replicated state.
	AdvertisedHTTP() string
	Self() config.PeerConfig
	// Source is the data path's view of a mirror's source cluster.
	Source(mir raftstore.Mirror) fetch.Source
	// DestinationClusterID is the destination cluster's ID, recorded with
	// a last mirrored position.
	DestinationClusterID(ctx context.Context) (string, error)
	// Go runs f as one of the member's loops (stopped and waited for on
	// shutdown).
	Go(f func())
	// DestinationUnanswered is since when the destination has not
	// answered this member (its probe, or a produce of one of its
	// partitions); zero while it answers.
	DestinationUnanswered() time.Time
	// SourceUnreachable reports whether this member's probe finds the
	// mirror's source not answering now.
	SourceUnreachable(mirror string) bool
}

// Config is what the owner duties read of the member's configuration.
type Config struct {
	NodeID        string
	RaftAdvertise string
	// DataDir holds the drained-on-stop marker (announce.go).
	DataDir string
	// LeaseTTL and LeaseMargin: this member writes while it heard from
	// the leader within LeaseTTL - LeaseMargin (design.md section 3).
	LeaseTTL, LeaseMargin time.Duration
	// ClientID is the member's Kafka client.id (group sync's source
	// clients).
	ClientID string
}

// Owner runs a member's duties for the partitions leased to it: the lease
// (self-fencing), reconciling leases with the data path, the handoff,
// stop and drop jobs, the data path's reports (Control) and the commands
// to the leader (the outbox), and the member's own record.
type Owner struct {
	cfg    Config
	store  Store
	member Member
	log    *zap.Logger
	ctx    context.Context
	engine *fetch.Engine
	dest   *kafka.Admin
	groups *GroupSync

	lease leaseState
	grant grantState
	// paused holds the lease loop and the renewals while set: in-process
	// tests play a process pause (SIGSTOP) with it (Pause).
	paused atomic.Bool
	// checkPaused holds the lease loop alone (PauseLeaseCheck).
	checkPaused atomic.Bool
	// leaseStop ends the lease loop, which outlives the member's other
	// loops: the data path drains under the lease at shutdown (StopLease).
	leaseStop context.CancelFunc
	leaseCtx  context.Context
	leaseDone chan struct{}
	leaseRun  sync.Once
	owner     ownerState
	out       *outbox
}

// New returns the owner duties of a member whose life is ctx; dest is
// the destination cluster (group sync commits there). SetEngine gives it
// the data path (built with Control); Run starts it.
func New(ctx context.Context, cfg Config, store Store, dest *kafka.Admin, member Member, log *zap.Logger) *Owner {
	o := &Owner{cfg: cfg, store: store, dest: dest, member: member, log: log, ctx: ctx, leaseDone: make(chan struct{})}
	o.leaseCtx, o.leaseStop = context.WithCancel(context.Background())
	o.owner.init()
	// No lease until the first grant: nothing to fence at start.
	o.lease.fenced = true
	o.out = newOutbox(o)
	o.groups = newGroupSync(o)
	return o
}

// StopLease ends the lease loop and waits for it; call it once the data
// path has closed. Until then the member keeps renewing its lease while
// its other loops have stopped, so the drain at shutdown can write and
// checkpoint (issue 18: the lease ended 500 ms into the drain, which then
// waited its whole bound and wrote no final checkpoint).
func (o *Owner) StopLease() {
	o.leaseStop()
	started := true
	o.leaseRun.Do(func() { started = false })
	if started {
		<-o.leaseDone
	}
}

// Groups is the member's consumer group offset sync.
func (o *Owner) Groups() *GroupSync { return o.groups }

// Control is the data path's control plane on this member (fetch.Control).
func (o *Owner) Control() fetch.Control { return &control{o: o} }

// SetEngine gives the owner the data path it assigns partitions to.
func (o *Owner) SetEngine(e *fetch.Engine) { o.engine = e }

// Run starts the lease loop (until StopLease), and the owner loop, the
// outbox, the member's announcement and the group offset sync as member
// loops.
func (o *Owner) Run() {
	o.startLease()
	o.member.Go(o.ownerLoop)
	o.member.Go(o.out.run)
	o.member.Go(o.announce)
	o.member.Go(o.groups.run)
}

// Pause holds (on) or releases this member's lease loop and renewals, as
// a process pause (SIGSTOP, a VM freeze) would: in-process tests only.
func (o *Owner) Pause(on bool) { o.paused.Store(on) }

// PauseLeaseCheck holds (on) or releases the lease loop alone, as a
// scheduler that runs a woken process's renewals before its lease check
// can: in-process tests only (the write deadline's bound on the last check
// covers that gap, lease.go).
func (o *Owner) PauseLeaseCheck(on bool) { o.checkPaused.Store(on) }

// waitUnpaused returns once Pause(false), or the lease loop ends.
func (o *Owner) waitUnpaused() {
	for o.paused.Load() && o.leaseCtx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
}

// waitCheckUnpaused is waitUnpaused for the lease loop, which
// PauseLeaseCheck holds too.
func (o *Owner) waitCheckUnpaused() {
	for (o.paused.Load() || o.checkPaused.Load()) && o.leaseCtx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
}

// RunLease starts the lease alone: the lease loop and the renewals it
// counts (once; Run calls it). StopLease ends them. In-process groups in
// tests run only this.
func (o *Owner) RunLease() { o.startLease() }

// WriteDeadline is the end of this member's lease: the zero time when it
// holds none (fetch.Control.WriteDeadline).
func (o *Owner) WriteDeadline() time.Time { return o.writeDeadline() }

// startLease starts the lease loop and the renewals it counts (once).
func (o *Owner) startLease() {
	o.leaseRun.Do(func() {
		go func() {
			defer close(o.leaseDone)
			renewed := make(chan struct{})
			go func() {
				defer close(renewed)
				o.renewLoop()
			}()
			o.leaseLoop()
			<-renewed
		}()
	})
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
