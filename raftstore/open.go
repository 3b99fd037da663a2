package raftstore

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// HasState reports whether dataDir holds raft state (a log, a stable
// store entry or a snapshot) from an earlier run.
func HasState(dataDir string) (bool, error) {
	path := filepath.Join(dataDir, "raft.db")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	bolt, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{Timeout: boltOpenTimeout}})
	if errors.Is(err, bbolt.ErrTimeout) {
		return false, fmt.Errorf("raftstore: %s is locked; is another kmirror daemon using %s?", path, dataDir)
	}
	if err != nil {
		return false, fmt.Errorf("raftstore: open %s: %w", path, err)
	}
	defer bolt.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dataDir, retainSnapshots, newHCLog(zap.NewNop(), "raft"))
	if err != nil {
		return false, fmt.Errorf("raftstore: snapshot store in %s: %w", dataDir, err)
	}
	return raft.HasExistingState(bolt, bolt, snaps)
}

// Open starts raft for cfg and returns once it is running (not
// necessarily with a leader: see WaitForLeader).
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	rc := cfg.raftConfig()
	rc.Logger = newHCLog(logger, "raft")
	// raft blocks on NotifyCh: watchLeadership drains it.
	notify := make(chan bool, 16)
	rc.NotifyCh = notify
	s := &Store{log: logger.Named("raftstore"), fsm: NewFSM(), leadership: make(chan bool, 16), failing: map[string]time.Time{}, closed: make(chan struct{}), clock: ClockOrSystem(cfg.Clock)}

	trans := cfg.Transport
	cleanup := func() {
		if trans != nil && cfg.Transport == nil {
			if c, ok := trans.(raft.WithClose); ok {
				_ = c.Close()
			}
		}
		if s.bolt != nil {
			_ = s.bolt.Close()
		}
	}
	logs, stable, snaps, err := s.openStores(cfg, rc)
	if err != nil {
		cleanup()
		return nil, err
	}
	if trans == nil {
		if trans, err = s.openTransport(cfg, rc); err != nil {
			cleanup()
			return nil, err
		}
	}
	if cfg.Bootstrap {
		if err := s.bootstrapIfNew(cfg, rc, logs, stable, snaps, trans); err != nil {
			cleanup()
			return nil, err
		}
	}

	r, err := raft.NewRaft(rc, s.fsm, logs, stable, snaps, trans)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("raftstore: start raft: %w", err)
	}
	s.raft = r
	s.obsCh = make(chan raft.Observation, 64)
	s.obs = raft.NewObserver(s.obsCh, true, func(o *raft.Observation) bool {
		switch o.Data.(type) {
		case raft.FailedHeartbeatObservation, raft.ResumedHeartbeatObservation:
			return true
		}
		return false
	})
	r.RegisterObserver(s.obs)
	go s.watch(notify)
	go s.watchHeartbeats()
	s.log.Info("raft started", zap.String("addr", string(trans.LocalAddr())), zap.Bool("in_memory", cfg.InMemory))
	return s, nil
}

// openStores opens the raft log, stable and snapshot stores: in memory, or
// raft.db (bolt) and snapshots in cfg.DataDir. A bolt store opened is kept
// in s.bolt (closed by the caller on a later failure).
func (s *Store) openStores(cfg Config, rc *raft.Config) (raft.LogStore, raft.StableStore, raft.SnapshotStore, error) {
	if cfg.InMemory {
		mem := raft.NewInmemStore()
		return mem, mem, raft.NewInmemSnapshotStore(), nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, nil, nil, fmt.Errorf("raftstore: create DataDir: %w", err)
	}
	path := filepath.Join(cfg.DataDir, "raft.db")
	bolt, err := raftboltdb.New(raftboltdb.Options{
		Path:        path,
		BoltOptions: &bbolt.Options{Timeout: boltOpenTimeout},
	})
	if errors.Is(err, bbolt.ErrTimeout) {
		return nil, nil, nil, fmt.Errorf("raftstore: %s is locked; is another kmirror daemon using DataDir %s?", path, cfg.DataDir)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("raftstore: open %s: %w", path, err)
	}
	s.bolt = bolt
	cache, err := raft.NewLogCache(logCacheSize, bolt)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("raftstore: log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.DataDir, retainSnapshots, rc.Logger)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("raftstore: snapshot store in %s: %w", cfg.DataDir, err)
	}
	return cache, bolt, snaps, nil
}

// openTransport listens for raft on cfg.BindAddr (default cfg.RaftAddr),
// with cfg.TLS when set, advertising cfg.RaftAddr.
func (s *Store) openTransport(cfg Config, rc *raft.Config) (raft.Transport, error) {
	// A nil advertise address advertises the listener's, which raft
	// refuses for 0.0.0.0.
	bind := cfg.BindAddr
	if bind == "" {
		bind = cfg.RaftAddr
	}
	adv, err := net.ResolveTCPAddr("tcp", cfg.RaftAddr)
	if err != nil {
		return nil, fmt.Errorf("raftstore: RaftAddr %q: %w", cfg.RaftAddr, err)
	}
	layer, err := newStreamLayer(bind, adv, cfg.TLS, s.log)
	if err != nil {
		return nil, fmt.Errorf("raftstore: listen on %q for raft: %w", bind, err)
	}
	s.stream = layer
	nt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: tcpMaxPool, Timeout: tcpTimeout, Logger: rc.Logger,
	})
	s.netTrans = nt
	return nt, nil
}

// bootstrapIfNew writes the group's first configuration (this member
// alone, or cfg.Peers) when the stores hold no raft state yet.
func (s *Store) bootstrapIfNew(cfg Config, rc *raft.Config, logs raft.LogStore, stable raft.StableStore, snaps raft.SnapshotStore, trans raft.Transport) error {
	existing, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return fmt.Errorf("raftstore: check for existing raft state: %w", err)
	}
	if existing {
		return nil
	}
	conf := raft.Configuration{Servers: []raft.Server{{
		Suffrage: raft.Voter,
		ID:       rc.LocalID,
		Address:  trans.LocalAddr(),
	}}}
	if len(cfg.Peers) > 0 {
		conf.Servers = nil
		for _, p := range cfg.Peers {
			suffrage := raft.Voter
			if !p.Voter {
				suffrage = raft.Nonvoter
			}
			conf.Servers = append(conf.Servers, raft.Server{Suffrage: suffrage, ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.Addr)})
		}
	}
	if err := raft.BootstrapCluster(rc, logs, stable, snaps, trans, conf); err != nil {
		return fmt.Errorf("raftstore: bootstrap: %w", err)
	}
	s.log.Info("bootstrapped a new raft group", zap.Int("servers", len(conf.Servers)))
	return nil
}
