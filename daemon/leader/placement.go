package leader

import (
	"sort"

	"github.com/kmirror/kmirror/raftstore"
)

// MaxMoves bounds the graceful handoffs in flight at once, so a rebalance
// moves a few partitions at a time and lag stays bounded.
const MaxMoves = 8

// Plan is what the leader changes in one round: assignments (one raft
// entry) and handoff requests.
type Plan struct {
	Assign []raftstore.Assignment
	Moves  []raftstore.RequestMove
}

// PlanAssignments decides where partitions go (design.md section 3): every
// active partition gets a live owner; the partitions of a member that is
// gone or unreachable past the lease TTL are taken over (the producer
// epoch is bumped); draining members hand theirs off; and while leased
// counts differ by more than one between eligible members, partitions move
// by graceful handoff, at most maxMoves in flight. alive reports whether a
// member was heard from within the lease TTL. It reads s only; the same
// inputs give the same plan.
func PlanAssignments(s *raftstore.State, alive func(id string) bool) Plan {
	// A member gets partitions once it has run with raft state (Joined):
	// one added with `members add` and not started yet gets none.
	var eligible []string
	for id, mem := range s.Members {
		if !mem.Draining && mem.Joined && alive(id) {
			eligible = append(eligible, id)
		}
	}
	sort.Strings(eligible)
	if len(eligible) == 0 {
		return Plan{}
	}
	load := map[string]int{}
	for _, id := range eligible {
		load[id] = 0
	}
	type part struct {
		key raftstore.PartitionKey
		p   *raftstore.PartitionInfo
		run bool // MIRRORING topic: may be moved for balance
	}
	var parts []part
	for _, t := range sortedTopics(s) {
		switch t.State {
		case raftstore.StateMirroring, raftstore.StateFailed, raftstore.StateStopping:
		default:
			continue
		}
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.State == raftstore.StateStopped {
				continue
			}
			parts = append(parts, part{raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}, p,
				t.State == raftstore.StateMirroring && p.State == raftstore.StateMirroring})
		}
	}
	owns := func(id string) bool { _, ok := load[id]; return ok }
	moving := 0
	// A partition being handed off counts for its target already, so the
	// next round does not move more than the balance needs.
	for _, x := range parts {
		switch {
		case x.p.MoveTo != "" && owns(x.p.MoveTo):
			load[x.p.MoveTo]++
		case owns(x.p.Owner):
			load[x.p.Owner]++
		}
		if x.p.MoveTo != "" {
			moving++
		}
	}
	least := func() string {
		best := eligible[0]
		for _, id := range eligible[1:] {
			if load[id] < load[best] {
				best = id
			}
		}
		return best
	}
	var out Plan
	for _, x := range parts {
		owner := x.p.Owner
		mem, known := s.Members[owner]
		switch {
		case owner == "":
			to := least()
			load[to]++
			out.Assign = append(out.Assign, raftstore.Assignment{Key: x.key, Owner: to, From: x.p.Generation})
		case !known || !alive(owner):
			to := least()
			load[to]++
			out.Assign = append(out.Assign, raftstore.Assignment{Key: x.key, Owner: to, From: x.p.Generation, Takeover: true})
		case x.p.MoveTo != "" && !owns(x.p.MoveTo):
			// The target is gone or draining: move elsewhere, or stay.
			to := ""
			if mem.Draining {
				to = least()
				load[to]++
			} else {
				moving--
				if owns(owner) {
					load[owner]++
				}
			}
			out.Moves = append(out.Moves, raftstore.RequestMove{Key: x.key, Generation: x.p.Generation, To: to})
		case mem.Draining && x.p.MoveTo == "" && moving < MaxMoves:
			to := least()
			load[to]++
			moving++
			out.Moves = append(out.Moves, raftstore.RequestMove{Key: x.key, Generation: x.p.Generation, To: to})
		}
	}
	// Rebalance by handoff: from the most to the least loaded member.
	for _, x := range parts {
		if moving >= MaxMoves {
			break
		}
		from := x.p.Owner
		if !x.run || x.p.MoveTo != "" || !owns(from) {
			continue
		}
		to := least()
		if load[from]-load[to] <= 1 {
			continue
		}
		load[from]--
		load[to]++
		moving++
		out.Moves = append(out.Moves, raftstore.RequestMove{Key: x.key, Generation: x.p.Generation, To: to})
	}
	return out
}

func sortedTopics(s *raftstore.State) []*raftstore.MirrorTopic {
	keys := make([]string, 0, len(s.Topics))
	for k := range s.Topics {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*raftstore.MirrorTopic, len(keys))
	for i, k := range keys {
		out[i] = s.Topics[k]
	}
	return out
}
