package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/daemon/httpapi"
	"github.com/kmirror/kmirror/daemon/leader"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/daemon/ops"
	"github.com/kmirror/kmirror/daemon/owner"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// A Member serves the admin API and the member-to-member routes; NewHandler
// finds the latter by a type assertion, so a method that drifted would
// silently drop routes: these fail the build instead.
var (
	_ api.Service      = (*Member)(nil)
	_ httpapi.Internal = (*Member)(nil)
)

// Member is one kmirror daemon: the raft store, the data path engine and
// the admin API, wired together (the package doc lists its files by duty).
type Member struct {
	cfg config.Config
	// lagRing is the last hour of the group's lag for the status page.
	lagRing lagRing
	// verify is the background verification of this member's partitions.
	verify verifier
	log    *zap.Logger
	store  *raftstore.Store
	// openStore is store for readers that may run before it is open.
	openStore atomic.Pointer[raftstore.Store]
	engine    *fetch.Engine
	dest      *kafka.Admin
	// auth secures the API, served and called (api section).
	auth *httpapi.Auth
	// destPrincipal is kmirror's principal on the destination.
	destPrincipal string
	// lead runs the leader's duties while this member leads.
	lead *leader.Leader
	srv  *http.Server
	addr net.Addr
	// conns bounds the API's connections per client.
	conns *httpapi.ConnLimiter
	// handler is the HTTP handler; it answers only probes until started.
	handler atomic.Pointer[http.Handler]
	started atomic.Bool
	// hadState: data_dir held raft state at start.
	hadState bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Ops serves the operator's verbs (api.Service but Ready; the
	// leader's FinishPending).
	*ops.Ops

	// own runs the owner duties for the partitions leased to this member.
	own *owner.Owner
	// sources probes every mirror's source cluster (automatic failover);
	// destination probes the destination (reach.go).
	sources     *sourceProbe
	destination *destinationProbe

	// leaseVia, when set, carries lease renewals to the leader in place
	// of its internal API (in-process groups in tests, which serve no
	// HTTP).
	leaseVia func(ctx context.Context, leaderID string) (api.LeaseGrant, error)
	// applyVia, when set, carries this member's commands (Submit) to the
	// leader in place of its internal API, as leaseVia does.
	applyVia func(ctx context.Context, leaderID string, entry []byte) error

	readyMu  sync.Mutex
	readyAt  time.Time
	readyErr error
}

// Run runs a member until ctx is cancelled, then shuts down in order (see
// Stop). It returns nil after a clean shutdown.
func Run(ctx context.Context, cfg config.Config, logger *zap.Logger) error {
	m, err := Start(ctx, cfg, logger)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return m.Stop()
}

// Start serves HTTP (probes only at first), forms or joins the raft group,
// starts the data path and then the whole API. ctx bounds the start-up.
func Start(ctx context.Context, cfg config.Config, logger *zap.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logger.With(zap.String("node", cfg.NodeID))
	if err := checkNodeID(cfg.DataDir, cfg.NodeID); err != nil {
		return nil, err
	}
	hadState, err := raftstore.HasState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	destSettings, err := cfg.Destination.SecuritySettings()
	if err != nil {
		return nil, err
	}
	destSecurity := mirrorprops.SecurityOf(destSettings)
	destPrincipal := cfg.Destination.Principal
	if destPrincipal == "" {
		if destPrincipal, err = destSettings.Principal(); err != nil {
			return nil, err
		}
	}
	auth, err := httpapi.NewAuth(cfg.API, cfg.NodeID, log.Named("http"))
	if err != nil {
		return nil, err
	}
	raftTLS, err := cfg.Raft.Build()
	if err != nil {
		return nil, fmt.Errorf("raft_tls: %w", err)
	}
	m := &Member{
		auth:          auth,
		destPrincipal: destPrincipal,
		cfg:           cfg,
		log:           log,
		hadState:      hadState,
		dest:          kafka.NewAdmin("destination cluster", cfg.Destination.BootstrapServers, cfg.Destination.ClientID, destSecurity),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.sources = newSourceProbe(m)
	m.destination = &destinationProbe{m: m}
	fail := func(err error) (*Member, error) {
		m.cancel()
		if m.srv != nil {
			m.srv.Close()
		}
		if st := m.storeOrNil(); st != nil {
			st.Close()
		}
		m.dest.Close()
		return nil, err
	}
	if err := m.listen(); err != nil {
		return fail(err)
	}
	bootstrap := false
	if !hadState {
		if bootstrap, err = m.bootstrapDecision(ctx); err != nil {
			return fail(err)
		}
	}
	var peers []raftstore.Server
	for _, p := range cfg.Peers {
		peers = append(peers, raftstore.Server{ID: p.ID, Addr: p.Raft, Voter: p.IsVoter()})
	}
	store, err := raftstore.Open(raftstore.Config{
		NodeID:    cfg.NodeID,
		RaftAddr:  cfg.RaftAdvertise,
		BindAddr:  cfg.RaftListen,
		DataDir:   cfg.DataDir,
		Bootstrap: bootstrap,
		Peers:     peers,
		Logger:    log,
		TLS:       raftTLS,
	})
	if err != nil {
		return fail(err)
	}
	m.setStore(store)
	if err := m.waitForLeader(ctx); err != nil {
		return fail(err)
	}
	m.own = owner.New(m.ctx, owner.Config{NodeID: cfg.NodeID, RaftAdvertise: cfg.RaftAdvertise, DataDir: cfg.DataDir,
		LeaseTTL: cfg.LeaseTTL, LeaseMargin: cfg.LeaseMargin, ClientID: cfg.Destination.ClientID}, m.store, m.dest, m, log)
	m.engine = fetch.New(fetch.Config{
		ClientID:            cfg.Destination.ClientID,
		Destination:         cfg.Destination.BootstrapServers,
		DestinationSecurity: destSecurity,
		MemoryBudget:        int64(cfg.MemoryBudget),
		TranslationMaxBytes: int64(cfg.TranslationMaxBytes),
		Checkpoint:          cfg.CheckpointInterval,
		InternalRF:          cfg.Destination.ReplicationFactor,
		ProduceTimeout:      cfg.ProduceTimeout,
		ProduceWindow:       cfg.ProduceWindow,
	}, m.own.Control(), log)
	m.own.SetEngine(m.engine)
	// The data path starts once the destination answers, however long
	// that takes (the engine retries what is retriable; ctx ends it on
	// SIGTERM). Meanwhile this member must not lead: the leader grants
	// the leases and runs the leader loop, which wait for the start.
	yielded := m.yieldLeadership()
	err = m.engine.Start(ctx)
	yielded()
	if err != nil {
		return fail(fmt.Errorf("start data path: %w", err))
	}
	m.lead = leader.New(m.ctx, leader.Config{NodeID: cfg.NodeID, LeaseTTL: cfg.LeaseTTL, Peers: cfg.Peers, DestPrincipal: m.destPrincipal,
		HooksDir: cfg.HooksDir},
		m.store, m.dest, m, log)
	m.wireOps()
	mx := newMetrics(m.engine, m.skippedRecords, m.own.Groups(), m.sources, m.lead)
	mx.auth = m.auth
	mx.late = m.lateRecords
	mx.conns = m.conns
	mx.destination = m.destination
	mx.lease = m.own.LeaseStatus
	mx.verify = &m.verify
	full := httpapi.NewHandler(m, m.log, mx.handler())
	m.handler.Store(&full)
	m.started.Store(true)
	m.Go(m.lead.Run)
	m.own.Run()
	m.Go(m.sources.loop)
	m.Go(m.destination.loop)
	m.Go(func() { m.lagSampler(m.ctx) })
	m.Go(func() { m.verifyLoop(m.ctx) })
	log.Info("kmirror member started", zap.String("http", m.addr.String()), zap.String("raft", cfg.RaftAdvertise),
		zap.Int("peers", len(cfg.Peers)))
	return m, nil
}

// wireOps builds the operator verbs on the member's parts (after the data
// path and the leader duties exist).
func (m *Member) wireOps() {
	var engine ops.Engine // nil without a data path (RunLease alone, in tests)
	if m.engine != nil {
		engine = m.engine
	}
	m.Ops = ops.New(ops.Config{NodeID: m.cfg.NodeID, ClientID: m.cfg.Destination.ClientID, ReplicationFactor: m.cfg.Destination.ReplicationFactor},
		m.store, m.dest, engine, m.lead, m, m.log)
}

// Go runs f as one of the member's loops: Stop waits for it (owner.Member).
func (m *Member) Go(f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
}

func (m *Member) setStore(s *raftstore.Store) {
	m.store = s
	m.openStore.Store(s)
}

// storeOrNil is the store, or nil before it is open (probes during start).
func (m *Member) storeOrNil() *raftstore.Store { return m.openStore.Load() }

// waitForLeader waits until the member knows a leader. A member that is
// not in the group yet waits until it is added.
func (m *Member) waitForLeader(ctx context.Context) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := m.store.WaitForLeader(wctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("raft group has no leader: %w", ctx.Err())
		}
		m.log.Warn("no raft leader known yet: waiting for a quorum of the group; a new member waits until it is added "+
			"(kmirror members add ID --raft ADDR --http ADDR)", zap.Strings("peers", peerIDs(m.cfg.Peers)))
	}
}

func peerIDs(peers []config.PeerConfig) []string {
	ids := make([]string, len(peers))
	for i, p := range peers {
		ids[i] = p.ID
	}
	return ids
}

// HTTPAddr is the address the API listens on.
func (m *Member) HTTPAddr() string { return m.addr.String() }

// listen serves HTTP at once: peers probe a starting member, and
// orchestrators see /healthz.
func (m *Member) listen() error {
	ln, err := net.Listen("tcp", m.cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("http_listen %s: %w", m.cfg.HTTPListen, err)
	}
	m.addr = ln.Addr()
	boot := http.Handler(httpapi.StartingHandler(m.Probe))
	m.handler.Store(&boot)
	m.srv = httpapi.NewServer(m.auth.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*m.handler.Load()).ServeHTTP(w, r) })),
		m.log.Named("http"))
	m.conns = httpapi.Limit(ln, httpapi.MaxConnsPerClient, httpapi.MaxConns, m.log.Named("http"))
	m.srv.ConnState = m.conns.Track
	ln = m.conns
	if cfg := m.auth.ServerTLS(); cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	if m.cfg.API.Insecure && !isLoopback(m.addr) {
		m.log.Warn("api.insecure: true: the API is reachable beyond this host without a token or without TLS, so whoever reaches it "+
			"(or reads its traffic) can change the group; set api.token_file and api.tls", zap.String("http_listen", m.cfg.HTTPListen))
	}
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server stopped", zap.Error(err))
		}
	}()
	return nil
}

// apiStopWait is how long a stop waits for API requests in progress, and
// for connections that never sent one: net/http counts such a connection
// idle only once it is over 5 s old (a client's spare connection, dialed
// while another answered, holds Shutdown that long; CI saw a stop that
// waited 5 s exit 1 with "stop http: context deadline exceeded").
const apiStopWait = 10 * time.Second

// shutdownAPI stops srv: it waits up to wait for requests in progress and
// then closes what is left (a caller sees its connection drop and retries;
// a member forwards to the new leader), which is not a failed stop. It
// reports whether anything had to be closed.
func shutdownAPI(srv *http.Server, wait time.Duration, log *zap.Logger) (closed bool) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Warn("API requests or connections still open when the stop stopped waiting: closed", zap.Duration("waited", wait), zap.Error(err))
		srv.Close()
		return true
	}
	return false
}

// Stop shuts down in order: hand this member's partitions to the others
// (when there are others), hand raft leadership to another voter (when
// this member leads), stop serving the API, stop the loops, drain the data
// path (final checkpoints), close raft.
func (m *Member) Stop() error {
	m.log.Info("stopping kmirror member: handing off or draining partitions")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if m.own != nil { // nil when Start failed before the data path ran
		m.own.HandOffAll(ctx)
	}
	m.leaveLeadership(ctx)
	var errs []error
	shutdownAPI(m.srv, apiStopWait, m.log)
	m.cancel()
	m.wg.Wait()
	if err := m.engine.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain data path: %w", err))
	}
	if m.own != nil {
		m.own.StopLease() // the drain wrote under the lease
	}
	m.dest.Close()
	if err := m.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close raft: %w", err))
	}
	m.log.Info("kmirror member stopped")
	return errors.Join(errs...)
}

// leaveLeadership hands raft leadership to another voter when this member
// leads, before Stop closes the API: the other members renew their leases
// through the leader's API (daemon/leasegrant.go), so a leader that drains
// without a successor fences every member until an election by timeout.
// A group without another voter keeps its single leader (nothing to do).
func (m *Member) leaveLeadership(ctx context.Context) {
	if !m.store.IsLeader() || !m.otherVoter() {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := m.store.TransferLeadership(tctx); err != nil {
		m.log.Warn("could not hand raft leadership to another voter before stopping; the group elects a leader when this one is gone",
			zap.Error(err))
		return
	}
	// The new leader is known here once its first heartbeat arrives.
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
	_ = m.store.WaitForLeader(wctx) // the log line only: it names "" if none came
	wcancel()
	_, id := m.store.Leader()
	m.log.Info(LogLeadershipHandedOn, zap.String("leader", id))
}

// LogLeadershipHandedOn is logged when a member hands raft leadership on
// (tests look for it).
const LogLeadershipHandedOn = "handed raft leadership to another voter"

// yieldLeadership hands raft leadership on whenever this member wins it
// (checked every 5 s) until the returned func is called: a member that
// cannot start its data path yet (its destination link is down, say) must
// not keep the group without a working leader.
func (m *Member) yieldLeadership() (stop func()) {
	ctx, cancel := context.WithCancel(m.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				m.leaveLeadership(ctx)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// otherVoter reports whether the raft configuration has a voter besides
// this member (false when it cannot be read).
func (m *Member) otherVoter() bool {
	servers, err := m.store.Servers()
	if err != nil {
		return false
	}
	for _, srv := range servers {
		if srv.Voter && srv.ID != m.cfg.NodeID {
			return true
		}
	}
	return false
}

// lateRecords returns, on the leader, the records of late batches found
// in STOPPED partitions, for /metrics.
func (m *Member) lateRecords() map[fetch.Key]int64 {
	out := map[fetch.Key]int64{}
	if !m.store.IsLeader() {
		return out
	}
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for i, p := range t.Partitions {
				if p.LateRecords > 0 {
					out[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}] = p.LateRecords
				}
			}
		}
	})
	return out
}

// skippedRecords returns the skipped-record counts of the partitions this
// member owns, for /metrics.
func (m *Member) skippedRecords() map[fetch.Key]int64 {
	out := map[fetch.Key]int64{}
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for i, p := range t.Partitions {
				if p.Owner == m.cfg.NodeID && p.SkippedRecords > 0 {
					out[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}] = p.SkippedRecords
				}
			}
		}
	})
	return out
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// AdvertisedHTTP is the HTTP address other members reach this one on.
func (m *Member) AdvertisedHTTP() string {
	if p := m.Self(); p.HTTP != "" && len(m.cfg.Peers) > 0 {
		return p.HTTP
	}
	return m.addr.String()
}

// Source is the data path's view of a mirror's source cluster
// (owner.Member).
func (m *Member) Source(mir raftstore.Mirror) fetch.Source { return mirrorprops.Source(mir) }

// DestinationClusterID is the destination cluster's ID (owner.Member).
func (m *Member) DestinationClusterID(ctx context.Context) (string, error) {
	return m.dest.ClusterID(ctx)
}
