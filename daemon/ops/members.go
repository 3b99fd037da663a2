package ops

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/raftstore"
)

// Members lists the group's members as the leader sees them.
func (o *Ops) Members(ctx context.Context) ([]api.MemberStatus, error) {
	c, err := o.member.ToLeader(ctx)
	if err != nil {
		return nil, err
	}
	if c != nil {
		return c.Members(ctx)
	}
	servers, err := o.store.Servers()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrNotLeader, err)
	}
	_, leader := o.store.Leader()
	alive, _ := o.lead.Alive()
	owned := map[string]int{}
	members := map[string]raftstore.Member{}
	o.store.Read(func(s *raftstore.State) {
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
	var out []api.MemberStatus
	for _, srv := range servers {
		mem := members[srv.ID]
		row := api.MemberStatus{ID: srv.ID, RaftAddr: srv.Addr, HTTPAddr: mem.HTTPAddr, Partitions: owned[srv.ID], State: "alive",
			LeaseTTLMs: mem.LeaseTTLMs}
		switch {
		case srv.ID == leader:
			row.Role = "leader"
		case srv.Voter:
			row.Role = "follower"
		default:
			row.Role = "non-voter"
		}
		row.LeaseGrantedMs = -1
		if srv.ID != o.cfg.NodeID {
			now := o.store.Clock().Now()
			row.LastContactMs = now.Sub(o.store.PeerContact(srv.ID)).Milliseconds()
			if at, granted := o.store.LeaseGrant(srv.ID); granted {
				row.LeaseGrantedMs = now.Sub(at).Milliseconds()
			}
		}
		failing := srv.ID != o.cfg.NodeID && o.store.PeerFailing(srv.ID)
		if !mem.Joined && failing {
			row.LastContactMs = -1 // never heard from since it was added (or since this leader took over)
		}
		switch {
		case !mem.Joined:
			row.State = "not started" // added, never joined: it gets no partitions yet
		case !alive(srv.ID) || failing:
			row.State = "unreachable" // its partitions move once lease_ttl has passed
		case mem.Draining:
			row.State = "draining"
		}
		if failing {
			// Why raft cannot reach it: not running, or running with
			// raft_tls settings that refuse this member (or that it refuses).
			if err := o.store.PeerDialError(srv.Addr); err != nil {
				row.Error = err.Error()
			}
		}
		out = append(out, row)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// AddMember adds a member to the raft configuration and the state.
func (o *Ops) AddMember(ctx context.Context, req api.AddMemberRequest) error {
	if !config.NodeIDPattern.MatchString(req.ID) {
		return fmt.Errorf("%w: member ID %q: use letters, digits, '.', '_' and '-' (the member's node_id)", api.ErrInvalid, req.ID)
	}
	if err := config.CheckAddress(req.RaftAddr, false); err != nil {
		return fmt.Errorf("%w: --raft: %v", api.ErrInvalid, err)
	}
	if err := config.CheckAddress(req.HTTPAddr, false); err != nil {
		return fmt.Errorf("%w: --http: %v", api.ErrInvalid, err)
	}
	c, err := o.member.ToLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.AddMember(ctx, req)
	}
	if err := o.checkNewMember(req); err != nil {
		return err
	}
	// Into the raft configuration first: a record of a member that is not
	// in it is dropped by the leader loop (removedMembers).
	if req.NonVoter {
		err = o.store.AddNonvoter(req.ID, req.RaftAddr)
	} else {
		err = o.store.AddVoter(req.ID, req.RaftAddr)
	}
	if err != nil {
		return StoreErr(err)
	}
	mem := raftstore.Member{ID: req.ID, RaftAddr: req.RaftAddr, HTTPAddr: req.HTTPAddr, Voter: !req.NonVoter}
	o.store.Read(func(s *raftstore.State) {
		if cur, ok := s.Members[req.ID]; ok { // adding again keeps what it has done
			mem.Joined, mem.Draining = cur.Joined, cur.Draining
		}
	})
	return StoreErr(o.store.Apply(ctx, raftstore.UpsertMember{Member: mem}))
}

// checkNewMember refuses an ID the group has already, unless the request
// repeats that member's addresses exactly (an add retried after it half
// failed): an add must not rewrite where a member is reached, or the
// group's forwarded requests, with the token, would follow (issue 18).
func (o *Ops) checkNewMember(req api.AddMemberRequest) error {
	servers, err := o.store.Servers()
	if err != nil {
		return StoreErr(err)
	}
	raftAddr, inConfig, voter := "", false, false
	for _, srv := range servers {
		switch {
		case srv.ID == req.ID:
			raftAddr, inConfig, voter = srv.Addr, true, srv.Voter
		case config.SameEndpoint(srv.Addr, req.RaftAddr):
			return fmt.Errorf("%w: raft address %s is member %s's: give each member its own", api.ErrExists, req.RaftAddr, srv.ID)
		}
	}
	var rec *raftstore.Member
	var others []raftstore.Member
	o.store.Read(func(s *raftstore.State) {
		for id, m := range s.Members {
			if id == req.ID {
				c := *m
				rec = &c
			} else {
				others = append(others, *m)
			}
		}
	})
	other := "" // compared outside the state's lock: names may be resolved
	for _, m := range others {
		if config.SameEndpoint(m.HTTPAddr, req.HTTPAddr) || config.SameEndpoint(m.RaftAddr, req.RaftAddr) {
			other = m.ID
		}
	}
	if other != "" {
		return fmt.Errorf("%w: --raft %s or --http %s is an address of member %s: give each member its own (the others forward "+
			"requests, with the API token, to a member's http address)", api.ErrExists, req.RaftAddr, req.HTTPAddr, other)
	}
	if !inConfig && rec == nil {
		return nil
	}
	same := (!inConfig || raftAddr == req.RaftAddr) && (rec == nil || (rec.RaftAddr == req.RaftAddr && rec.HTTPAddr == req.HTTPAddr))
	if same && inConfig && voter == req.NonVoter {
		return fmt.Errorf("%w: member %s is in the group already as a %s: members add does not change whether a member votes; "+
			"remove it (kmirror members remove %s) and add it again", api.ErrExists, req.ID, map[bool]string{true: "voter", false: "non-voter"}[voter], req.ID)
	}
	if same {
		return nil
	}
	have := "raft " + raftAddr
	if rec != nil {
		have = "raft " + rec.RaftAddr + ", http " + rec.HTTPAddr
	}
	return fmt.Errorf("%w: member %s is in the group already (%s): members add does not change a member's addresses; "+
		"to move it, remove it (kmirror members remove %s) and add it again, or pick a new ID", api.ErrExists, req.ID, have, req.ID)
}

// RemoveMember removes a member from the raft configuration and the
// state. A member that still holds partitions and is alive is refused:
// drain it first, so its partitions move by handoff. The leader may remove
// itself: it steps down once the change is committed.
func (o *Ops) RemoveMember(ctx context.Context, id string) error {
	c, err := o.member.ToLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.RemoveMember(ctx, id)
	}
	n, known := 0, false
	o.store.Read(func(s *raftstore.State) {
		_, known = s.Members[id]
		for _, t := range s.Topics {
			for _, p := range t.Partitions {
				if p.Owner == id && p.State != raftstore.StateStopped {
					n++
				}
			}
		}
	})
	alive, inConfig := o.lead.Alive()
	if !known && !inConfig[id] {
		return fmt.Errorf("%w: member %s is not in the group (see kmirror members)", api.ErrNotFound, id)
	}
	if n > 0 && alive(id) {
		return fmt.Errorf("%w: member %s still holds %d partitions: drain it first (kmirror members drain %s), then remove it", api.ErrConflict, id, n, id)
	}
	// Out of the raft configuration first: from then on the member is not
	// alive for the leader, its partitions are taken over after the lease,
	// and its record is dropped once it owns none (the leader's round, daemon/leader). The
	// leader may remove itself: it steps down once the change is committed,
	// and the next leader drops its record.
	return StoreErr(o.store.RemoveServer(id))
}

// DrainMember marks a member draining (or not).
func (o *Ops) DrainMember(ctx context.Context, id string, drain bool) error {
	c, err := o.member.ToLeader(ctx)
	if err != nil {
		return err
	}
	if c != nil {
		return c.DrainMember(ctx, id, drain)
	}
	err = o.store.Apply(ctx, raftstore.SetDraining{ID: id, Draining: drain})
	if errors.Is(err, raftstore.ErrNotFound) {
		return fmt.Errorf("%w: member %s is not in the group (see kmirror members)", api.ErrNotFound, id)
	}
	return StoreErr(err)
}
