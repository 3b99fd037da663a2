package raftstore

import (
	"math"
	"testing"
)

// lease is the current lease of p1 in x.
func (x *fixture) lease(k PartitionKey) Lease {
	x.t.Helper()
	p, ok := x.state().Partition(k)
	if !ok {
		x.t.Fatalf("no partition %s", k)
	}
	return Lease{Owner: p.Owner, Generation: p.Generation}
}

func (x *fixture) part(k PartitionKey) PartitionInfo {
	x.t.Helper()
	p, _ := x.state().Partition(k)
	return *p
}

func TestAssignPartitionsChecksGeneration(t *testing.T) {
	x := newFixture(t)
	p0 := PartitionKey{Mirror: "m1", Topic: "orders", Partition: 0}
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p0, Owner: "n1"}, {Key: p1, Owner: "n1"}}})
	gen := x.idx
	for _, k := range []PartitionKey{p0, p1} {
		if l := x.lease(k); l != (Lease{Owner: "n1", Generation: gen}) {
			t.Fatalf("%s lease %+v, want n1 at %d", k, l, gen)
		}
	}
	// A decision made on an old generation is skipped, the rest applies.
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p0, Owner: "n2", From: gen - 1}, {Key: p1, Owner: "n2", From: gen}}})
	if l := x.lease(p0); l.Owner != "n1" || l.Generation != gen {
		t.Fatalf("stale assignment applied: %+v", l)
	}
	if l := x.lease(p1); l.Owner != "n2" || l.Generation != x.idx {
		t.Fatalf("p1 lease %+v, want n2 at %d", l, x.idx)
	}
	// Unknown partitions are skipped, not an error: the topic may be gone.
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: PartitionKey{Mirror: "m1", Topic: "gone"}, Owner: "n1"}}})
}

func TestTakeoverKeepsIdentity(t *testing.T) {
	x := newFixture(t)
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1"}}})
	id := ProducerIdentity{ProducerID: 42, Epoch: 7, Allocated: true}
	x.mustApply(SetProducer{Key: p1, Producer: id, Generation: x.idx, Owner: "n1"})
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n2", From: x.idx - 1, Takeover: true}}})
	if p := x.part(p1); p.Producer != id || p.Owner != "n2" || p.Generation != x.idx {
		t.Fatalf("after takeover %+v, want n2 at %d with producer %+v unchanged", p, x.idx, id)
	}
}

func TestRenewAtLastEpochDropsIdentity(t *testing.T) {
	x := newFixture(t)
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1"}}})
	x.mustApply(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 42, Epoch: math.MaxInt16, Allocated: true}, Generation: x.idx, Owner: "n1"})
	x.mustApply(RenewProducer{Key: p1, Lease: x.lease(p1)})
	if got := x.part(p1).Producer; got.Allocated {
		t.Fatalf("renewal at the last epoch left %+v, want no identity (the owner allocates a new producer ID)", got)
	}
}

func TestRenewProducer(t *testing.T) {
	x := newFixture(t)
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1"}}})
	x.mustApply(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 5, Allocated: true}, Generation: x.idx, Owner: "n1"})
	l := x.lease(p1)
	x.mustFail(RenewProducer{Key: p1, Lease: Lease{Owner: "n2", Generation: l.Generation}}, ErrStaleGeneration)
	x.mustFail(RenewProducer{Key: p1, Lease: Lease{Owner: "n1", Generation: l.Generation - 1}}, ErrStaleGeneration)
	x.mustApply(RenewProducer{Key: p1, Lease: l, Reason: "OUT_OF_ORDER_SEQUENCE_NUMBER"})
	p := x.part(p1)
	if p.Producer.Epoch != 1 || p.Generation != x.idx || p.Owner != "n1" {
		t.Fatalf("after renew %+v, want epoch 1, generation %d, owner n1", p, x.idx)
	}
	// The renewal changed the generation: the same request again is stale.
	x.mustFail(RenewProducer{Key: p1, Lease: l}, ErrStaleGeneration)
}

func TestHandoff(t *testing.T) {
	x := newFixture(t)
	x.mustApply(UpsertMember{Member: Member{ID: "n2"}})
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1"}}})
	gen := x.idx
	x.mustFail(RequestMove{Key: p1, Generation: gen, To: "n9"}, ErrNotFound)
	x.mustFail(RequestMove{Key: p1, Generation: gen - 1, To: "n2"}, ErrStaleGeneration)
	x.mustApply(RequestMove{Key: p1, Generation: gen, To: "n2"})
	if p := x.part(p1); p.MoveTo != "n2" || p.Generation != gen {
		t.Fatalf("after RequestMove %+v, want MoveTo n2 in generation %d", p, gen)
	}
	cp := Checkpoint{SourceOffset: 100, DestinationOffset: 90, SourceLeaderEpoch: 3, Sequence: 12,
		Producer: ProducerIdentity{ProducerID: 9, Epoch: 1, Allocated: true}}
	x.mustFail(ReleasePartition{Key: p1, Lease: Lease{Owner: "n2", Generation: gen}, Checkpoint: &cp}, ErrStaleGeneration)
	x.mustApply(ReleasePartition{Key: p1, Lease: Lease{Owner: "n1", Generation: gen}, Checkpoint: &cp})
	p := x.part(p1)
	if p.Owner != "n2" || p.Generation != x.idx || p.MoveTo != "" || p.Handoff == nil || *p.Handoff != cp || p.Producer != cp.Producer {
		t.Fatalf("after release %+v, want n2 at %d with handoff %+v", p, x.idx, cp)
	}
	// A handoff to a member that began draining meanwhile leaves the
	// partition unowned for the leader to place; the checkpoint stays.
	x.mustApply(RequestMove{Key: p1, Generation: x.idx, To: "n1"})
	x.mustApply(SetDraining{ID: "n1", Draining: true})
	x.mustApply(ReleasePartition{Key: p1, Lease: Lease{Owner: "n2", Generation: x.idx - 2}, Checkpoint: &cp})
	if p := x.part(p1); p.Owner != "" || p.Handoff == nil {
		t.Fatalf("release to a draining member: %+v, want unowned with the handoff kept", p)
	}
	// A takeover (crash) drops the handoff: the old owner may have written.
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n2", From: x.idx}}})
	if p := x.part(p1); p.Handoff == nil {
		t.Fatal("a plain assignment of an unowned partition dropped its handoff")
	}
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1", From: x.idx, Takeover: true}}})
	if p := x.part(p1); p.Handoff != nil {
		t.Fatalf("takeover kept the handoff %+v", p.Handoff)
	}
	x.mustFail(SetDraining{ID: "n9", Draining: true}, ErrNotFound)
}

func TestPartitionStoppedCarriesTopicToStopped(t *testing.T) {
	x := newFixture(t)
	keys := []PartitionKey{{Mirror: "m1", Topic: "orders", Partition: 0}, p1, {Mirror: "m1", Topic: "orders", Partition: 2}}
	var as []Assignment
	for _, k := range keys {
		as = append(as, Assignment{Key: k, Owner: "n1"})
	}
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustApply(AssignPartitions{Assignments: as})
	l := x.lease(p1)
	pos := Position{SourceOffset: 5, DestinationOffset: 4, SourceClusterID: "c"}
	x.mustFail(PartitionStopped{Key: p1, Lease: l, Position: pos}, ErrInvalid) // not STOPPING
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping})
	// A member's report cannot take a STOPPING partition back.
	x.mustFail(SetPartitionState{Key: p1, State: StateMirroring, Lease: l}, ErrInvalid)
	for i, k := range keys {
		if i == 2 {
			x.mustFail(PartitionStopped{Key: k, Lease: Lease{Owner: "n2", Generation: l.Generation}, Position: pos}, ErrStaleGeneration)
		}
		x.mustApply(PartitionStopped{Key: k, Lease: l, Position: pos})
		mt := x.topic("m1", "orders")
		want := StateStopping
		if i == 2 {
			want = StateStopped
		}
		if mt.State != want {
			t.Fatalf("after %d of 3 partitions stopped: topic %s, want %s", i+1, mt.State, want)
		}
		if p := mt.Partitions[i]; p.State != StateStopped || p.Owner != "" || p.LastMirrored == nil || *p.LastMirrored != pos || p.Generation != x.idx {
			t.Fatalf("partition %d = %+v", i, p)
		}
	}
	// A stopped partition is never assigned again.
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1", From: x.part(p1).Generation}}})
	if p := x.part(p1); p.Owner != "" {
		t.Fatalf("stopped partition assigned to %q", p.Owner)
	}
}

// TestSettleStopped: a partition stopped with records past its position
// that could not be verified keeps their end; SettleStopped moves the
// position on and clears it, once: a partition with nothing left to
// verify, or not STOPPED, refuses it.
func TestSettleStopped(t *testing.T) {
	x := newFixture(t)
	k0 := PartitionKey{Mirror: "m1", Topic: "orders", Partition: 0}
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: k0, Owner: "n1"}, {Key: p1, Owner: "n1"}}})
	known := Position{SourceOffset: 5, DestinationOffset: 4, SourceClusterID: "c"}
	settled := Position{SourceOffset: 9, DestinationOffset: 8, SourceClusterID: "c"}
	x.mustFail(SettleStopped{Key: p1, Position: settled}, ErrInvalid) // MIRRORING
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping})
	x.mustApply(PartitionStopped{Key: k0, Lease: x.lease(k0), Position: known})
	x.mustApply(PartitionStopped{Key: p1, Lease: x.lease(p1), Position: known, Reason: "offsets 4..7 unverified", UnverifiedEnd: 8})
	if p := x.part(p1); p.UnverifiedEnd != 8 || p.Reason != "offsets 4..7 unverified" || *p.LastMirrored != known {
		t.Fatalf("stopped with unverified records: %+v", p)
	}
	x.mustFail(SettleStopped{Key: k0, Position: settled}, ErrInvalid) // nothing to verify
	x.mustApply(SettleStopped{Key: p1, Position: settled, Reason: "settled"})
	if p := x.part(p1); p.UnverifiedEnd != 0 || p.Reason != "settled" || *p.LastMirrored != settled || p.State != StateStopped {
		t.Fatalf("settled: %+v", p)
	}
	x.mustFail(SettleStopped{Key: p1, Position: settled}, ErrInvalid) // once
	if p := x.part(k0); *p.LastMirrored != known {
		t.Fatalf("the other partition moved: %+v", p)
	}
}

// TestRecordLateBatch: a late batch is named on a STOPPED partition only,
// counted once however often a leader finds it, and the list is bounded
// while the count goes on.
func TestRecordLateBatch(t *testing.T) {
	x := newFixture(t)
	k0 := PartitionKey{Mirror: "m1", Topic: "orders", Partition: 0}
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: k0, Owner: "n1"}, {Key: p1, Owner: "n1"}}})
	late := func(at int64) LateBatch {
		return LateBatch{FirstOffset: at, LastOffset: at + 9, ProducerID: 7, BaseSequence: int32(at), Records: 10}
	}
	x.mustFail(RecordLateBatch{Key: p1, Batch: late(100)}, ErrInvalid) // MIRRORING
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping})
	x.mustApply(PartitionStopped{Key: p1, Lease: x.lease(p1), Position: Position{DestinationOffset: 100}, AtMs: 1234})
	if p := x.part(p1); p.StoppedAtMs != 1234 {
		t.Fatalf("stop time not kept: %+v", p)
	}
	x.mustApply(RecordLateBatch{Key: p1, Batch: late(100)})
	x.mustApply(RecordLateBatch{Key: p1, Batch: late(100)}) // found again
	for i := range 20 {
		x.mustApply(RecordLateBatch{Key: p1, Batch: late(int64(200 + 10*i))})
	}
	if p := x.part(p1); len(p.LateBatches) != maxLateBatches || p.LateRecords != 210 || p.LateEnd != 400 || p.LateBatches[0] != late(100) {
		t.Fatalf("late batches: %d listed, %d records, end %d, first %+v", len(p.LateBatches), p.LateRecords, p.LateEnd, p.LateBatches[0])
	}
}

// TestLeaderDivergedBumpsGeneration: the leader's DIVERGED (a destination
// topic recreated) gives the partition a new generation, so its owner's
// report observed before it (MIRRORING) is refused instead of turning the
// partition back to MIRRORING (issue 19).
func TestLeaderDivergedBumpsGeneration(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1"}}})
	before := x.lease(p1)
	x.mustApply(SetPartitionState{Key: p1, State: StateDiverged, Reason: "destination topic recreated"})
	if p := x.part(p1); p.Generation == before.Generation || p.Owner != "n1" {
		t.Fatalf("leader's DIVERGED kept generation %d (owner %q)", p.Generation, p.Owner)
	}
	x.mustFail(SetPartitionState{Key: p1, State: StateMirroring, Lease: before}, ErrStaleGeneration)
	if p := x.part(p1); p.State != StateDiverged {
		t.Fatalf("state %s after a stale report", p.State)
	}
}

// TestNoGrantDuringTakeover: between the leader marking a takeover of a
// member's partitions and the takeover's entry being applied, the member
// is granted no lease (a grant then counted from before the commit, with a
// state index before it, let the member write partitions already given to
// another); other members are; once the mark ends, grants resume.
func TestNoGrantDuringTakeover(t *testing.T) {
	s := &Store{}
	now := SystemClock{}.Now()
	end := s.BeginTakeover("n2")
	again := s.BeginTakeover("n2") // a second chunk of the same round
	if s.RecordLeaseGrant("n2", now) {
		t.Fatal("n2 was granted a lease while its partitions were being taken over")
	}
	if !s.RecordLeaseGrant("n3", now) {
		t.Fatal("n3, not taken over, was refused a lease")
	}
	end()
	end() // idempotent: the other mark still holds
	if s.RecordLeaseGrant("n2", now) {
		t.Fatal("n2 was granted a lease while a second takeover was being applied")
	}
	again()
	if !s.RecordLeaseGrant("n2", now) {
		t.Fatal("n2 refused a lease after every takeover was applied")
	}
	if at, ok := s.LeaseGrant("n2"); !ok || !at.Equal(now) {
		t.Fatalf("n2's grant = %v, %t; want %v", at, ok, now)
	}
}
