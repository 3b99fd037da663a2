package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
)

func TestCheckNodeID(t *testing.T) {
	dir := t.TempDir()
	if err := checkNodeID(dir, "m1"); err != nil {
		t.Fatalf("first start: %v", err)
	}
	if err := checkNodeID(dir, "m1"); err != nil {
		t.Fatalf("restart with the same node_id: %v", err)
	}
	err := checkNodeID(dir, "m2")
	if err == nil || !strings.Contains(err.Error(), `holds the raft state of member "m1", but node_id is "m2"`) ||
		!strings.Contains(err.Error(), "start with node_id: m1") {
		t.Fatalf("another node_id on the same data_dir: %v", err)
	}
}

// fakePeer answers the start-up probe with pr, or 503 when pr is nil.
func fakePeer(t *testing.T, pr *api.RaftProbe) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if pr == nil || r.URL.Path != "/v1/internal/raft" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(pr)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func joinMember(t *testing.T, peers ...config.PeerConfig) *Member {
	self := config.PeerConfig{ID: "m1", Raft: "127.0.0.1:7001", HTTP: "127.0.0.1:8001"}
	return &Member{cfg: config.Config{NodeID: "m1", DataDir: "/data", RaftAdvertise: self.Raft, Peers: append([]config.PeerConfig{self}, peers...)},
		log: zaptest.NewLogger(t)}
}

func TestBootstrapDecision(t *testing.T) {
	ctx := context.Background()
	fresh := &api.RaftProbe{NodeID: "x"}
	running := &api.RaftProbe{NodeID: "x", HasState: true, Joined: []string{"m2", "m3"}}
	ranBefore := &api.RaftProbe{NodeID: "x", HasState: true, Joined: []string{"m1", "m2"}}
	down := "127.0.0.1:1"

	t.Run("alone bootstraps", func(t *testing.T) {
		if boot, err := joinMember(t).bootstrapDecision(ctx); err != nil || !boot {
			t.Fatalf("got %t, %v; want bootstrap", boot, err)
		}
	})
	t.Run("a quorum of fresh voters bootstraps", func(t *testing.T) {
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: fakePeer(t, fresh)}, config.PeerConfig{ID: "m3", HTTP: down})
		fresh.Peers = peersKey(m.cfg.Peers)
		if boot, err := m.bootstrapDecision(ctx); err != nil || !boot {
			t.Fatalf("got %t, %v; want bootstrap (2 of 3 voters up and fresh)", boot, err)
		}
	})
	t.Run("another peers list is refused", func(t *testing.T) {
		other := &api.RaftProbe{NodeID: "m2", Peers: []string{"m1=127.0.0.1:7001", "m2=x:1"}}
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: fakePeer(t, other)}, config.PeerConfig{ID: "m3", HTTP: down})
		_, err := m.bootstrapDecision(ctx)
		if !errors.Is(err, api.ErrRefused) || !strings.Contains(err.Error(), "member m2 lists peers [m1=127.0.0.1:7001,m2=x:1]") {
			t.Fatalf("got %v, want a refusal naming both peers lists", err)
		}
	})
	t.Run("a running group is joined", func(t *testing.T) {
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: fakePeer(t, running)}, config.PeerConfig{ID: "m3", HTTP: down})
		if boot, err := m.bootstrapDecision(ctx); err != nil || boot {
			t.Fatalf("got %t, %v; want join", boot, err)
		}
	})
	t.Run("a wiped member is refused", func(t *testing.T) {
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: fakePeer(t, ranBefore)}, config.PeerConfig{ID: "m3", HTTP: down})
		_, err := m.bootstrapDecision(ctx)
		if !errors.Is(err, api.ErrRefused) || !strings.Contains(err.Error(), "could vote twice") || !strings.Contains(err.Error(), "kmirror members remove m1") {
			t.Fatalf("got %v, want the wiped-member refusal saying what to do", err)
		}
	})
	t.Run("no quorum waits", func(t *testing.T) {
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: down}, config.PeerConfig{ID: "m3", HTTP: fakePeer(t, nil)})
		wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		_, err := m.bootstrapDecision(wctx)
		if err == nil || !strings.Contains(err.Error(), "1 of 3 voters up") {
			t.Fatalf("got %v, want a wait for a quorum that names how many are up", err)
		}
	})
	t.Run("non-voters do not count toward the quorum", func(t *testing.T) {
		no := false
		m := joinMember(t, config.PeerConfig{ID: "m2", HTTP: fakePeer(t, fresh), Voter: &no}, config.PeerConfig{ID: "m3", HTTP: down})
		fresh.Peers = peersKey(m.cfg.Peers)
		wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		if _, err := m.bootstrapDecision(wctx); err == nil {
			t.Fatal("bootstrapped with one voter of two up")
		}
	})
}
