package raftstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const testWait = 10 * time.Second

// TestMain fails the run if a test leaves goroutines behind (raft loops,
// transports, apply waiters).
func TestMain(m *testing.M) {
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		if err := waitGoroutines(before); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func waitGoroutines(want int) error {
	deadline := time.Now().Add(testWait)
	if flag.Lookup("test.fuzz").Value.String() != "" {
		want++ // the fuzzing engine's os/signal loop
	}
	for runtime.NumGoroutine() > want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			return fmt.Errorf("leaked goroutines: %d running, %d at start\n%s", runtime.NumGoroutine(), want, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(testWait)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out after %s waiting for %s", testWait, what)
		}
	}
}

func fastConfig(t *testing.T, id string) Config {
	return Config{
		NodeID:             id,
		Logger:             testLogger(t).Named(id),
		HeartbeatTimeout:   50 * time.Millisecond,
		ElectionTimeout:    50 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
	}
}

// testLogger logs warnings and errors to t until the test's last cleanup
// (registered first, run last). hashicorp/raft's connection goroutines
// can still log after Store.Close has returned, and testing panics on a
// log after the test has completed.
func testLogger(t *testing.T) *zap.Logger {
	w := &cutOffWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.done = true
	})
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(w), zap.WarnLevel))
}

type cutOffWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *cutOffWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	t.Cleanup(cancel)
	return ctx
}

func mustOpen(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("open %s: %v", cfg.NodeID, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func storeState(s *Store) *State {
	var st *State
	s.Read(func(x *State) { st = x.Clone() })
	return st
}

func TestConfigValidate(t *testing.T) {
	ok := Config{NodeID: "n1", RaftAddr: "127.0.0.1:7000", DataDir: "/tmp/x"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		field  string
		mutate func(*Config)
	}{
		{"NodeID", func(c *Config) { c.NodeID = "" }},
		{"DataDir", func(c *Config) { c.DataDir = "" }},
		{"RaftAddr", func(c *Config) { c.RaftAddr = "" }},
		{"HeartbeatTimeout", func(c *Config) { c.HeartbeatTimeout = -time.Second }},
		{"CommitTimeout", func(c *Config) { c.CommitTimeout = time.Microsecond }},
		{"LeaderLeaseTimeout", func(c *Config) { c.HeartbeatTimeout = 50 * time.Millisecond }},
	}
	for _, c := range cases {
		cfg := ok
		c.mutate(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: error %v does not name the field", c.field, err)
		}
	}
	mem := Config{NodeID: "n1", InMemory: true, RaftAddr: "x"}
	if err := mem.Validate(); err != nil {
		t.Fatalf("InMemory without DataDir: %v", err)
	}
}

// TestStoreReopen runs a single-node store on disk, restarts it from the
// same DataDir once with only the log and once with a snapshot plus a log
// tail, and expects the same state each time.
func TestStoreReopen(t *testing.T) {
	dir := t.TempDir()
	cfg := fastConfig(t, "n1")
	cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = dir, "127.0.0.1:0", true
	ctx := ctxT(t)

	s := mustOpen(t, cfg)
	if err := s.WaitForLeader(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1 to lead", s.IsLeader)
	cfg.RaftAddr, _ = s.Leader() // reopen on the port the first run got

	apply := func(s *Store, cmds ...Command) {
		t.Helper()
		for _, c := range cmds {
			if err := s.Apply(ctx, c); err != nil {
				t.Fatalf("apply %s: %v", c.Type(), err)
			}
		}
	}
	apply(s,
		CreateMirror{Mirror: Mirror{Name: "m1", Bootstrap: []string{"src:9092"}}},
		AddTopic{Topic: MirrorTopic{Mirror: "m1", Topic: "orders", State: StatePending, Partitions: []PartitionInfo{{State: StatePending}, {State: StatePending, StartOffset: 7}}}},
		Assign{Key: PartitionKey{Mirror: "m1", Topic: "orders", Partition: 1}, Owner: "n1"},
		UpsertMember{Member: Member{ID: "n1", RaftAddr: cfg.RaftAddr, Voter: true}},
	)
	// The FSM's refusal comes back through Store.Apply.
	if err := s.Apply(ctx, CreateMirror{Mirror: Mirror{Name: "m1"}}); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate mirror: %v, want ErrExists", err)
	}
	if err := s.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.VerifyLeader(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.AppliedIndex() == 0 || s.Stats()["state"] != "Leader" {
		t.Fatalf("applied index %d, stats %v", s.AppliedIndex(), s.Stats())
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Apply(cancelled, RemoveMember{ID: "n1"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("apply with cancelled ctx: %v", err)
	}

	reopen := func(want *State) *Store {
		t.Helper()
		if err := s.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		s = mustOpen(t, cfg)
		eventually(t, "state restored after reopen", func() bool {
			return reflect.DeepEqual(storeState(s), want)
		})
		return s
	}

	// Restart 1: log replay only.
	s = reopen(storeState(s))
	eventually(t, "n1 to lead again", s.IsLeader)

	// Restart 2: snapshot plus the entries applied after it.
	if err := s.raft.Snapshot().Error(); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	p1 := PartitionKey{Mirror: "m1", Topic: "orders", Partition: 1}
	gen := storeState(s).Topics["m1/orders"].Partitions[1].Generation
	apply(s,
		SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring, DestTopicID: "d1"},
		SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 3}, Generation: gen},
	)
	s = reopen(storeState(s))
	if s.Stats()["last_snapshot_index"] == "0" {
		t.Fatal("reopen did not find the snapshot")
	}
	if snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*")); len(snaps) == 0 {
		t.Fatalf("no snapshot in %s", dir)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

func TestOpenLockedDataDir(t *testing.T) {
	cfg := fastConfig(t, "n1")
	cfg.DataDir, cfg.RaftAddr, cfg.Bootstrap = t.TempDir(), "127.0.0.1:0", true
	mustOpen(t, cfg)
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open on the same DataDir: %v, want a lock error", err)
	}
}
