package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/raftstore"
)

// nodeIDFile holds, in data_dir, the node_id the raft state belongs to.
const nodeIDFile = "node_id"

// checkNodeID refuses a data directory that holds another member's raft
// state, and records the node_id in a new one.
func checkNodeID(dataDir, nodeID string) error {
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return fmt.Errorf("data_dir %s: %w", dataDir, err)
	}
	path := filepath.Join(dataDir, nodeIDFile)
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.WriteFile(path, []byte(nodeID+"\n"), 0o640)
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	}
	if got := strings.TrimSpace(string(b)); got != nodeID {
		return fmt.Errorf("%w: data_dir %s holds the raft state of member %q, but node_id is %q: "+
			"start with node_id: %s, or give this member its own empty data_dir", api.ErrRefused, dataDir, got, nodeID, got)
	}
	return nil
}

// peersKey lists peers as "id=raft-address" (a non-voter with "~"), sorted.
func peersKey(peers []config.PeerConfig) []string {
	out := make([]string, 0, len(peers))
	for _, p := range peers {
		v := p.ID + "=" + p.Raft
		if !p.IsVoter() {
			v += "~"
		}
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// bootstrapDecision decides how a member with an empty data directory
// starts: it bootstraps a new group (with every listed peer) only when a
// quorum of the listed voters is up and none has state; it joins when a
// peer has state and this member never ran with state; and it refuses when
// the group says this member ran before (a wiped data directory: it could
// vote twice in a term).
func (m *Member) bootstrapDecision(ctx context.Context) (bool, error) {
	others := 0
	for _, p := range m.cfg.Peers {
		if p.ID != m.cfg.NodeID {
			others++
		}
	}
	if others == 0 {
		return true, nil
	}
	voters := 0
	for _, p := range m.cfg.Peers {
		if p.IsVoter() {
			voters++
		}
	}
	quorum := voters/2 + 1
	client := m.auth.HTTPClient(time.Second)
	lastLog := time.Time{}
	for {
		fresh, missing := 0, []string{}
		if m.Self().IsVoter() {
			fresh++
		}
		for _, p := range m.cfg.Peers {
			if p.ID == m.cfg.NodeID {
				continue
			}
			pr, err := m.auth.ProbePeer(ctx, client, p.HTTP)
			if err != nil {
				missing = append(missing, p.ID)
				continue
			}
			if pr.HasState {
				for _, id := range pr.Joined {
					if id == m.cfg.NodeID {
						return false, fmt.Errorf("%w: data_dir %s holds no raft state, but member %s says the group already ran with member %s: "+
							"a wiped member must not rejoin under its old ID (it could vote twice in a term). "+
							"Remove it first (kmirror members remove %s), then add it again (kmirror members add %s --raft %s --http %s) and start it",
							api.ErrRefused, m.cfg.DataDir, p.ID, m.cfg.NodeID, m.cfg.NodeID, m.cfg.NodeID, m.cfg.RaftAdvertise, m.Self().HTTP)
					}
				}
				m.log.Info("joining the existing raft group", zap.String("peer", p.ID))
				return false, nil
			}
			if theirs, mine := strings.Join(pr.Peers, ","), strings.Join(peersKey(m.cfg.Peers), ","); theirs != mine {
				return false, fmt.Errorf("%w: member %s lists peers [%s], this member [%s]: a new group forms only from one peers list, "+
					"the same on every member; fix the configs and start again", api.ErrRefused, p.ID, theirs, mine)
			}
			if p.IsVoter() {
				fresh++
			}
		}
		if fresh >= quorum {
			return true, nil
		}
		if time.Since(lastLog) > 5*time.Second {
			m.log.Info("waiting for a quorum of peers before forming the raft group",
				zap.Int("up", fresh), zap.Int("quorum", quorum), zap.Strings("unreachable", missing))
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("waiting for a quorum of peers (%d of %d voters up; unreachable: %s): %w",
				fresh, voters, strings.Join(missing, ", "), ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Probe answers GET /v1/internal/raft for this member.
func (m *Member) Probe() api.RaftProbe {
	pr := api.RaftProbe{NodeID: m.cfg.NodeID, Peers: peersKey(m.cfg.Peers)}
	st := m.storeOrNil()
	if st == nil {
		pr.HasState = m.hadState
		return pr
	}
	pr.HasState = m.hadState || st.AppliedIndex() > 0
	st.Read(func(s *raftstore.State) {
		pr.StateIndex = s.Index
		for id, mem := range s.Members {
			if mem.Joined {
				pr.Joined = append(pr.Joined, id)
			}
		}
	})
	return pr
}

// Self is this member's entry in the peers list (a voter when peers is
// empty).
func (m *Member) Self() config.PeerConfig {
	for _, p := range m.cfg.Peers {
		if p.ID == m.cfg.NodeID {
			return p
		}
	}
	return config.PeerConfig{ID: m.cfg.NodeID, Raft: m.cfg.RaftAdvertise, HTTP: m.cfg.HTTPListen}
}
