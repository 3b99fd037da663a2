package daemon

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kmirror/kmirror/raftstore"
)

// Members lists the group's members as the leader sees them.
func (m *Member) Members(ctx context.Context) ([]MemberStatus, error) {
	c, err := m.toLeader(ctx)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.Members(ctx)
	}
	servers, err := m.store.Servers()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	_, leader := m.store.Leader()
	owned := map[string]int{}
	members := map[string]raftstore.Member{}
	m.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner != "" && p.State != raftstore.StateStopped {
					owned[p.Owner]++
				}
			}
		}
		for id, mem := range s.Members {
			members[id] = *mem
		}
	})
	var out []MemberStatus
	for _, srv := range servers {
		mem := members[srv.ID]
		row := MemberStatus{ID: srv.ID, RaftAddr: srv.Addr, HTTPAddr: mem.HTTPAddr, Partitions: owned[srv.ID], State: "alive"}
		switch {
		case srv.ID == leader:
			row.Role = "leader"
		case srv.Voter:
			row.Role = "follower"
		default:
			row.Role = "non-voter"
		}
		if srv.ID != m.cfg.NodeID {
			row.LastContactMs = time.Since(m.store.PeerContact(srv.ID)).Milliseconds()
		}
		switch {
		case !m.alive(srv.ID):
			row.State = "unreachable"
		case mem.Draining:
			row.State = "draining"
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// AddMember adds a member to the raft configuration and the state.
func (m *Member) AddMember(ctx context.Context, req AddMemberRequest) error {
	if !nodeIDPattern.MatchString(req.ID) {
		return fmt.Errorf("%w: member ID %q: use letters, digits, '.', '_' and '-' (the member's node_id)", ErrInvalid, req.ID)
	}
	if err := checkAddress(req.RaftAddr, false); err != nil {
		return fmt.Errorf("%w: --raft: %v", ErrInvalid, err)
	}
	if err := checkAddress(req.HTTPAddr, false); err != nil {
		return fmt.Errorf("%w: --http: %v", ErrInvalid, err)
	}
	c, err := m.toLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.AddMember(ctx, req)
	}
	if err := mapStoreErr(m.store.Apply(ctx, raftstore.UpsertMember{Member: raftstore.Member{
		ID: req.ID, RaftAddr: req.RaftAddr, HTTPAddr: req.HTTPAddr, Voter: !req.NonVoter}})); err != nil {
		return err
	}
	if req.NonVoter {
		err = m.store.AddNonvoter(req.ID, req.RaftAddr)
	} else {
		err = m.store.AddVoter(req.ID, req.RaftAddr)
	}
	return mapStoreErr(err)
}

// RemoveMember removes a member from the raft configuration and the
// state. A member that still holds partitions and is alive is refused:
// drain it first, so its partitions move by handoff. The leader may remove
// itself: it steps down once the change is committed.
func (m *Member) RemoveMember(ctx context.Context, id string) error {
	c, err := m.toLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.RemoveMember(ctx, id)
	}
	n, known := 0, false
	m.store.Read(func(s *raftstore.State) {
		_, known = s.Members[id]
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner == id && p.State != raftstore.StateStopped {
					n++
				}
			}
		}
	})
	if n > 0 && m.alive(id) {
		return fmt.Errorf("%w: member %s still holds %d partitions: drain it first (kmirror members drain %s), then remove it", ErrConflict, id, n, id)
	}
	// The record goes first: removing the leader itself from the raft
	// configuration makes it step down, and a new leader takes over.
	if known {
		if err := m.store.Apply(ctx, raftstore.RemoveMember{ID: id}); err != nil {
			return mapStoreErr(err)
		}
	}
	return mapStoreErr(m.store.RemoveServer(id))
}

// DrainMember marks a member draining (or not).
func (m *Member) DrainMember(ctx context.Context, id string, drain bool) error {
	c, err := m.toLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.DrainMember(ctx, id, drain)
	}
	err = mapStoreErr(m.store.Apply(ctx, raftstore.SetDraining{ID: id, Draining: drain}))
	if err != nil {
		return fmt.Errorf("%w (see kmirror members)", err)
	}
	return nil
}
