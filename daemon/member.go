package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// Member is one kmirror daemon: the raft store, the data path engine and
// the admin API, wired together.
type Member struct {
	cfg    Config
	log    *zap.Logger
	store  *raftstore.Store
	engine *fetch.Engine
	dest   *fetch.Admin
	srv    *http.Server
	addr   net.Addr

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// creating holds the topics an API request is creating right now, so
	// the reconcile loop does not finish them as leftovers concurrently.
	creatingMu sync.Mutex
	creating   map[string]bool

	readyMu  sync.Mutex
	readyAt  time.Time
	readyErr error
}

// Run runs a member until ctx is cancelled, then shuts down in order (see
// Stop). It returns nil after a clean shutdown.
func Run(ctx context.Context, cfg Config, logger *zap.Logger) error {
	m, err := Start(ctx, cfg, logger)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return m.Stop()
}

// Start opens the store, starts the data path and serves the API.
func Start(ctx context.Context, cfg Config, logger *zap.Logger) (*Member, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := logger.With(zap.String("node", cfg.NodeID))
	store, err := raftstore.Open(raftstore.Config{
		NodeID:    cfg.NodeID,
		RaftAddr:  cfg.RaftAdvertise,
		DataDir:   cfg.DataDir,
		Bootstrap: cfg.Bootstrap,
		Logger:    log,
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := store.WaitForLeader(wctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("raft group has no leader: %w", err)
	}
	m := &Member{
		creating: map[string]bool{},
		cfg:      cfg,
		log:      log,
		store:    store,
		dest:     fetch.NewAdmin("destination cluster", cfg.Destination.BootstrapServers, cfg.Destination.ClientID, nil),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.engine = fetch.New(fetch.Config{
		ClientID:     cfg.Destination.ClientID,
		Destination:  cfg.Destination.BootstrapServers,
		MemoryBudget: int64(cfg.MemoryBudget),
		Checkpoint:   cfg.CheckpointInterval,
		InternalRF:   cfg.Destination.ReplicationFactor,
	}, &control{m: m}, log)
	if err := m.engine.Start(wctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("start data path: %w", err)
	}
	if err := m.serve(); err != nil {
		m.engine.Close(context.Background())
		store.Close()
		return nil, err
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.reconcileLoop()
	}()
	log.Info("kmirror member started", zap.String("http", m.addr.String()), zap.String("raft", cfg.RaftAdvertise))
	return m, nil
}

// HTTPAddr is the address the API listens on.
func (m *Member) HTTPAddr() string { return m.addr.String() }

func (m *Member) serve() error {
	ln, err := net.Listen("tcp", m.cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("http_listen %s: %w", m.cfg.HTTPListen, err)
	}
	m.addr = ln.Addr()
	m.srv = &http.Server{
		Handler:           NewHandler(m, m.log, newMetrics(m.engine).handler()),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server stopped", zap.Error(err))
		}
	}()
	return nil
}

// Stop shuts down in order: stop serving the API, stop reconciling, drain
// the data path (every fetched batch produced, final checkpoints), close
// raft.
func (m *Member) Stop() error {
	m.log.Info("stopping kmirror member: draining partitions and writing final checkpoints")
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	var errs []error
	if err := m.srv.Shutdown(ctx); err != nil {
		errs = append(errs, fmt.Errorf("stop http: %w", err))
	}
	m.cancel()
	m.wg.Wait()
	if err := m.engine.Close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain data path: %w", err))
	}
	m.dest.Close()
	if err := m.store.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close raft: %w", err))
	}
	m.log.Info("kmirror member stopped")
	return errors.Join(errs...)
}

// reconcileLoop reacts to every state change (and a timer): on the leader
// it finishes pending topics and assigns partitions; on every member it
// hands the partitions leased to it to the data path.
func (m *Member) reconcileLoop() {
	changed, stop := m.store.Watch()
	defer stop()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if m.store.IsLeader() {
			m.leaderReconcile()
		}
		m.memberReconcile()
		select {
		case <-m.ctx.Done():
			return
		case <-changed:
		case <-t.C:
		}
	}
}

// leaderReconcile gives every unowned partition of an active topic an
// owner. With one member every partition goes to it; balancing across
// members and lease expiry come with multi-member groups.
func (m *Member) leaderReconcile() {
	var cmds []raftstore.Command
	var pending []raftstore.MirrorTopic
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			switch t.State {
			case raftstore.StatePending:
				pending = append(pending, *t)
			case raftstore.StateMirroring, raftstore.StateFailed, raftstore.StateStopping:
				for i, p := range t.Partitions {
					if p.Owner == "" && p.State != raftstore.StateStopped {
						cmds = append(cmds, raftstore.Assign{
							Key:   raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)},
							Owner: m.cfg.NodeID,
						})
					}
				}
			}
		}
	})
	for _, t := range pending {
		m.finishPending(t)
	}
	for _, c := range cmds {
		if err := m.store.Apply(m.ctx, c); err != nil && m.ctx.Err() == nil {
			m.log.Warn("assign partition", zap.Error(err))
		}
	}
}

// memberReconcile hands the data path the partitions leased to this member
// and the source settings of their mirrors.
func (m *Member) memberReconcile() {
	var specs []fetch.Spec
	sources := map[string]fetch.Source{}
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			// STOPPING topics are released by RemoveTopic; handing them
			// out again would restart a partition it has just stopped.
			if t.State != raftstore.StateMirroring && t.State != raftstore.StateFailed {
				continue
			}
			mir, ok := s.Mirrors[t.Mirror]
			if !ok {
				continue
			}
			sources[t.Mirror] = fetch.Source{Bootstrap: mir.Bootstrap}
			for i, p := range t.Partitions {
				if p.Owner != m.cfg.NodeID || p.State == raftstore.StateDiverged || p.State == raftstore.StateStopped {
					continue
				}
				spec := fetch.Spec{
					Key:         fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)},
					Generation:  p.Generation,
					StartOffset: p.StartOffset,
				}
				if p.Producer.Allocated {
					spec.Producer = &fetch.ProducerID{ID: p.Producer.ProducerID, Epoch: p.Producer.Epoch}
				}
				specs = append(specs, spec)
			}
		}
	})
	for name, src := range sources {
		m.engine.SetSource(name, src)
	}
	m.engine.Assign(specs)
}

// control implements fetch.Control over the raft store.
type control struct{ m *Member }

func (c *control) SaveProducer(ctx context.Context, k fetch.Key, gen uint64, id fetch.ProducerID) error {
	return c.m.store.Apply(ctx, raftstore.SetProducer{
		Key:        raftstore.PartitionKey{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition},
		Producer:   raftstore.ProducerIdentity{ProducerID: id.ID, Epoch: id.Epoch, Allocated: true},
		Generation: gen,
	})
}

// Report records FAILED and DIVERGED (and the return to MIRRORING) in the
// replicated state, so describe shows the reason from any member.
func (c *control) Report(k fetch.Key, state fetch.State, reason string) {
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
	key := raftstore.PartitionKey{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition}
	var cur raftstore.PartitionInfo
	found := false
	c.m.store.Read(func(st *raftstore.State) {
		if t, ok := st.Topic(k.Mirror, k.Topic); ok && int(k.Partition) < len(t.Partitions) {
			cur, found = t.Partitions[k.Partition], true
		}
	})
	if !found || (cur.State == s && cur.Reason == reason) || cur.State == raftstore.StateStopping || cur.State == raftstore.StateStopped {
		return
	}
	ctx, cancel := context.WithTimeout(c.m.ctx, 10*time.Second)
	defer cancel()
	if err := c.m.store.Apply(ctx, raftstore.SetPartitionState{Key: key, State: s, Reason: reason}); err != nil && ctx.Err() == nil {
		c.m.log.Warn("record partition state", zap.Stringer("partition", k), zap.String("state", string(s)), zap.Error(err))
	}
}
