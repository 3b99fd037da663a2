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
// member was heard from within the lease TTL. stuck (nil: none) reports a
// member that cannot reach a mirror's source while another member can:
// its partitions of that mirror are handed off and it gets none of them
// (issue 18: a member whose link stalled kept its partitions). It reads s
// only; the same inputs give the same plan.
//
// unproven (optional) reports a member that gets no new partitions (it is
// not a target of an assignment, a takeover or a handoff) while it keeps
// those it has: one that has not asked this leader for its lease yet.
func PlanAssignments(s *raftstore.State, alive func(id string) bool, stuck func(member, mirror string) bool, unproven ...func(id string) bool) Plan {
	if stuck == nil {
		stuck = func(string, string) bool { return false }
	}
	avoid := stuck
	if len(unproven) > 0 && unproven[0] != nil {
		up := unproven[0]
		avoid = func(member, mirror string) bool { return up(member) || stuck(member, mirror) }
	}
	// A member gets partitions once it has run with raft state (Joined):
	// one added with `members add` and not started yet gets none.
	pl := planner{s: s, alive: alive, stuck: stuck, avoid: avoid, load: map[string]int{}}
	for id, mem := range s.Members {
		if !mem.Draining && mem.Joined && alive(id) {
			pl.eligible = append(pl.eligible, id)
		}
	}
	sort.Strings(pl.eligible)
	if len(pl.eligible) == 0 {
		return Plan{}
	}
	for _, id := range pl.eligible {
		pl.load[id] = 0
	}
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
			pl.parts = append(pl.parts, placed{raftstore.PartitionKey{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}, p,
				t.State == raftstore.StateMirroring && p.State == raftstore.StateMirroring})
		}
	}
	// A partition being handed off counts for its target already, so the
	// next round does not move more than the balance needs.
	for _, x := range pl.parts {
		switch {
		case x.p.MoveTo != "" && pl.owns(x.p.MoveTo):
			pl.load[x.p.MoveTo]++
		case pl.owns(x.p.Owner):
			pl.load[x.p.Owner]++
		}
		if x.p.MoveTo != "" {
			pl.moving++
		}
	}
	for _, x := range pl.parts {
		pl.place(x)
	}
	pl.rebalance()
	return pl.out
}

// placed is one active partition as placement sees it; run: a MIRRORING
// partition of a MIRRORING topic, which may move for balance.
type placed struct {
	key raftstore.PartitionKey
	p   *raftstore.PartitionInfo
	run bool
}

// planner is one PlanAssignments run.
type planner struct {
	s     *raftstore.State
	alive func(id string) bool
	stuck func(member, mirror string) bool
	// avoid: stuck, or unproven; no new partitions go there.
	avoid    func(member, mirror string) bool
	eligible []string
	load     map[string]int // partitions per eligible member
	parts    []placed
	moving   int
	out      Plan
}

func (pl *planner) owns(id string) bool { _, ok := pl.load[id]; return ok }

// least is the least loaded member that reaches mirror's source (any
// member when none does: moving would not help).
func (pl *planner) least(mirror string) string {
	best := ""
	for _, id := range pl.eligible {
		if !pl.avoid(id, mirror) && (best == "" || pl.load[id] < pl.load[best]) {
			best = id
		}
	}
	if best == "" {
		best = pl.eligible[0]
		for _, id := range pl.eligible[1:] {
			if pl.load[id] < pl.load[best] {
				best = id
			}
		}
	}
	return best
}

// move hands x off to the least loaded member that reaches its source.
func (pl *planner) move(x placed) {
	to := pl.least(x.key.Mirror)
	pl.load[to]++
	pl.moving++
	pl.out.Moves = append(pl.out.Moves, raftstore.RequestMove{Key: x.key, Generation: x.p.Generation, To: to})
}

// place decides about one partition: an owner, a takeover, or a handoff
// off a draining or stuck member.
func (pl *planner) place(x placed) {
	owner := x.p.Owner
	mem, known := pl.s.Members[owner]
	switch {
	case owner == "":
		to := pl.least(x.key.Mirror)
		pl.load[to]++
		pl.out.Assign = append(pl.out.Assign, raftstore.Assignment{Key: x.key, Owner: to, From: x.p.Generation})
	case !known || !pl.alive(owner):
		to := pl.least(x.key.Mirror)
		pl.load[to]++
		pl.out.Assign = append(pl.out.Assign, raftstore.Assignment{Key: x.key, Owner: to, From: x.p.Generation, Takeover: true})
	case x.p.MoveTo != "" && !pl.owns(x.p.MoveTo):
		// The target is gone or draining: move elsewhere, or stay.
		to := ""
		if mem.Draining {
			to = pl.least(x.key.Mirror)
			pl.load[to]++
		} else {
			pl.moving--
			if pl.owns(owner) {
				pl.load[owner]++
			}
		}
		pl.out.Moves = append(pl.out.Moves, raftstore.RequestMove{Key: x.key, Generation: x.p.Generation, To: to})
	case mem.Draining && x.p.MoveTo == "" && pl.moving < MaxMoves:
		pl.move(x)
	case pl.stuck(owner, x.key.Mirror) && x.p.MoveTo == "" && pl.moving < MaxMoves && !pl.avoid(pl.least(x.key.Mirror), x.key.Mirror):
		if pl.owns(owner) {
			pl.load[owner]--
		}
		pl.move(x)
	}
}

// rebalance moves partitions by handoff from the most to the least loaded
// member, never off or onto a member stuck for the partition's mirror.
func (pl *planner) rebalance() {
	for _, x := range pl.parts {
		if pl.moving >= MaxMoves {
			return
		}
		from := x.p.Owner
		if !x.run || x.p.MoveTo != "" || !pl.owns(from) || pl.stuck(from, x.key.Mirror) {
			continue
		}
		to := pl.least(x.key.Mirror)
		if pl.load[from]-pl.load[to] <= 1 || pl.avoid(to, x.key.Mirror) {
			continue
		}
		pl.load[from]--
		pl.move(x)
	}
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
