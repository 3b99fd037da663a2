package leader

import (
	"testing"

	"github.com/kmirror/kmirror/raftstore"
)

// planState is a state with members and one MIRRORING topic of n
// partitions owned as owners says ("" = unowned).
func planState(members []string, owners []string) *raftstore.State {
	s := raftstore.NewState()
	for _, id := range members {
		s.Members[id] = &raftstore.Member{ID: id, Voter: true, Joined: true}
	}
	t := &raftstore.MirrorTopic{Mirror: "m", Topic: "t", State: raftstore.StateMirroring}
	for i, o := range owners {
		t.Partitions = append(t.Partitions, raftstore.PartitionInfo{State: raftstore.StateMirroring, Owner: o, Generation: uint64(10 + i)})
	}
	s.Topics[raftstore.TopicKey("m", "t")] = t
	return s
}

func everyone(string) bool { return true }

// applyPlan applies p to s as the FSM would, and completes every handoff
// (the owner releases to the target), returning the moves made.
func applyPlan(s *raftstore.State, p Plan) {
	for _, a := range p.Assign {
		part, _ := s.Partition(a.Key)
		if part.Generation == a.From {
			part.Owner, part.MoveTo = a.Owner, ""
			part.Generation += 100
		}
	}
	for _, mv := range p.Moves {
		part, _ := s.Partition(mv.Key)
		if part.Generation == mv.Generation {
			part.MoveTo = mv.To
		}
	}
}

func completeHandoffs(s *raftstore.State) int {
	n := 0
	for _, t := range s.Topics {
		for i := range t.Partitions {
			p := &t.Partitions[i]
			if p.MoveTo != "" {
				p.Owner, p.MoveTo = p.MoveTo, ""
				p.Generation += 100
				n++
			}
		}
	}
	return n
}

func counts(s *raftstore.State) map[string]int {
	c := map[string]int{}
	for _, t := range s.Topics {
		for _, p := range t.Partitions {
			c[p.Owner]++
		}
	}
	return c
}

func balanced(t *testing.T, s *raftstore.State, members []string) {
	t.Helper()
	c := counts(s)
	lo, hi := 1<<30, -1
	for _, id := range members {
		lo, hi = min(lo, c[id]), max(hi, c[id])
	}
	if hi-lo > 1 || c[""] != 0 {
		t.Fatalf("not balanced over %v: %v", members, c)
	}
}

func TestPlanAssignsUnownedBalanced(t *testing.T) {
	members := []string{"a", "b", "c"}
	s := planState(members, make([]string, 100))
	p := PlanAssignments(s, everyone, nil)
	if len(p.Assign) != 100 || len(p.Moves) != 0 {
		t.Fatalf("plan: %d assignments, %d moves; want 100, 0", len(p.Assign), len(p.Moves))
	}
	for _, a := range p.Assign {
		if a.Takeover {
			t.Fatalf("assignment of an unowned partition is a takeover: %+v", a)
		}
	}
	applyPlan(s, p)
	balanced(t, s, members)
	if p := PlanAssignments(s, everyone, nil); len(p.Assign)+len(p.Moves) != 0 {
		t.Fatalf("a balanced state planned %+v", p)
	}
}

func TestPlanTakesOverFromUnreachable(t *testing.T) {
	members := []string{"a", "b", "c"}
	owners := make([]string, 30)
	for i := range owners {
		owners[i] = members[i%3]
	}
	s := planState(members, owners)
	dead := func(id string) bool { return id != "b" }
	p := PlanAssignments(s, dead, nil)
	if len(p.Assign) != 10 {
		t.Fatalf("%d assignments, want b's 10", len(p.Assign))
	}
	for _, a := range p.Assign {
		part, _ := s.Partition(a.Key)
		if part.Owner != "b" || !a.Takeover || a.Owner == "b" || a.From != part.Generation {
			t.Fatalf("assignment %+v of a partition owned by %s", a, part.Owner)
		}
	}
	applyPlan(s, p)
	balanced(t, s, []string{"a", "c"})
	// A partition of a member no longer in the state is taken over too.
	delete(s.Members, "c")
	p = PlanAssignments(s, everyone, nil)
	for _, a := range p.Assign {
		if !a.Takeover {
			t.Fatalf("partition of a removed member assigned without takeover: %+v", a)
		}
	}
}

func TestPlanRebalancesByHandoffInSteps(t *testing.T) {
	// Member c joins a group where a and b hold everything: partitions
	// move to it by handoff, at most maxMoves at a time, never by
	// takeover, and the rounds end balanced without moving anything twice.
	members := []string{"a", "b", "c"}
	owners := make([]string, 60)
	for i := range owners {
		owners[i] = members[i%2]
	}
	s := planState(members, owners)
	moved := 0
	for round := 0; round < 20; round++ {
		p := PlanAssignments(s, everyone, nil)
		if len(p.Assign) != 0 {
			t.Fatalf("round %d assigned %+v: only handoffs may move live members' partitions", round, p.Assign)
		}
		if len(p.Moves) > MaxMoves {
			t.Fatalf("round %d asked for %d handoffs, more than %d", round, len(p.Moves), MaxMoves)
		}
		applyPlan(s, p)
		// A second plan before the handoffs complete asks for nothing more.
		if p2 := PlanAssignments(s, everyone, nil); len(p2.Moves) != 0 && len(p.Moves) == MaxMoves {
			t.Fatalf("round %d: %d more handoffs planned while %d are in flight", round, len(p2.Moves), MaxMoves)
		}
		n := completeHandoffs(s)
		moved += n
		if n == 0 {
			break
		}
	}
	balanced(t, s, members)
	if moved != 20 {
		t.Fatalf("%d handoffs, want exactly 20 (60 partitions over 3 members)", moved)
	}
}

func TestPlanDrainsByHandoff(t *testing.T) {
	members := []string{"a", "b", "c"}
	owners := make([]string, 12)
	for i := range owners {
		owners[i] = members[i%3]
	}
	s := planState(members, owners)
	s.Members["c"].Draining = true
	for round := 0; round < 10; round++ {
		p := PlanAssignments(s, everyone, nil)
		for _, mv := range p.Moves {
			if mv.To == "c" {
				t.Fatalf("handoff to the draining member: %+v", mv)
			}
		}
		applyPlan(s, p)
		if completeHandoffs(s) == 0 {
			break
		}
	}
	if c := counts(s); c["c"] != 0 {
		t.Fatalf("draining member still holds %d partitions: %v", c["c"], c)
	}
	balanced(t, s, []string{"a", "b"})
}

func TestPlanRetargetsHandoffToDeadMember(t *testing.T) {
	s := planState([]string{"a", "b"}, []string{"a"})
	part, _ := s.Partition(raftstore.PartitionKey{Mirror: "m", Topic: "t"})
	part.MoveTo = "b"
	p := PlanAssignments(s, func(id string) bool { return id == "a" }, nil)
	if len(p.Moves) != 1 || p.Moves[0].To != "" {
		t.Fatalf("handoff to an unreachable member not cancelled: %+v", p)
	}
}

func TestPlanSkipsStoppedAndPending(t *testing.T) {
	s := planState([]string{"a"}, []string{"", ""})
	s.Topics[raftstore.TopicKey("m", "t")].Partitions[1].State = raftstore.StateStopped
	s.Topics[raftstore.TopicKey("m", "p")] = &raftstore.MirrorTopic{Mirror: "m", Topic: "p", State: raftstore.StatePending,
		Partitions: []raftstore.PartitionInfo{{State: raftstore.StatePending}}}
	p := PlanAssignments(s, everyone, nil)
	if len(p.Assign) != 1 || p.Assign[0].Key.Partition != 0 || p.Assign[0].Key.Topic != "t" {
		t.Fatalf("plan %+v, want only t/0", p)
	}
	if p := PlanAssignments(planState(nil, []string{""}), everyone, nil); len(p.Assign) != 0 {
		t.Fatalf("assigned with no members: %+v", p)
	}
	// A member added but never started (not Joined) gets nothing.
	s = planState([]string{"a", "b"}, []string{"", "", "", ""})
	s.Members["b"].Joined = false
	for _, a := range PlanAssignments(s, everyone, nil).Assign {
		if a.Owner != "a" {
			t.Fatalf("partition given to a member that never started: %+v", a)
		}
	}
}

// TestPlanMovesOffStuckMember: a member that cannot reach mirror m's
// source while others can hands its partitions of m off, a few at a time,
// gets no new ones and none back by rebalancing; once every member is
// stuck (the source itself is down) nothing moves.
func TestPlanMovesOffStuckMember(t *testing.T) {
	members := []string{"a", "b", "c"}
	owners := make([]string, 30)
	for i := range owners {
		owners[i] = members[i%3]
	}
	s := planState(members, owners)
	stuckB := func(member, mirror string) bool { return member == "b" && mirror == "m" }
	for range 10 {
		p := PlanAssignments(s, everyone, stuckB)
		for _, mv := range p.Moves {
			if mv.To == "b" {
				t.Fatalf("a move onto the stuck member: %+v", mv)
			}
		}
		if len(p.Moves) > MaxMoves {
			t.Fatalf("%d moves at once, want at most %d", len(p.Moves), MaxMoves)
		}
		applyPlan(s, p)
		completeHandoffs(s)
	}
	c := counts(s)
	if c["b"] != 0 || c["a"]+c["c"] != 30 || c["a"]-c["c"] > 1 || c["c"]-c["a"] > 1 {
		t.Fatalf("after handing off the stuck member's partitions: %v, want b none and a, c balanced", c)
	}
	allStuck := func(string, string) bool { return true }
	s = planState(members, owners)
	if p := PlanAssignments(s, everyone, allStuck); len(p.Moves)+len(p.Assign) != 0 {
		t.Fatalf("with every member stuck (the source down) the plan moved %+v", p)
	}
}
