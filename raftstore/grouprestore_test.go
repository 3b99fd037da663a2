package raftstore

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestApplyGroupRestores: the positions a truncation kept are replaced as
// a whole, cleared per partition only by its lease's owner and only where
// equal to what was given back, and dropped with their topic or mirror;
// a clone does not share them.
func TestApplyGroupRestores(t *testing.T) {
	p0 := PartitionKey{Mirror: "m1", Topic: "orders", Partition: 0}
	x := newFixture(t)
	k := TopicKey("m1", "orders")
	g0 := GroupRestore{Group: "g", Partition: 0, DestinationCommitted: 1050, SourceOffset: 1000, Metadata: "m"}
	g1 := GroupRestore{Group: "g", Partition: 1, DestinationCommitted: 70, SourceOffset: 70}
	h0 := GroupRestore{Group: "h", Partition: 0, DestinationCommitted: 5, SourceOffset: 5}
	x.mustApply(SetGroupRestores{Mirror: "m1", Topic: "orders", Restores: []GroupRestore{g0, g1, h0}})
	x.mustFail(SetGroupRestores{Topic: "orders"}, ErrInvalid)

	c := x.state().Clone()
	c.GroupRestores[k][0].SourceOffset = 1
	if got := x.state().GroupRestores[k][0]; got != g0 {
		t.Fatalf("mutating a clone changed the state: %+v", got)
	}

	x.mustApply(Assign{Key: p0, Owner: "n1"})
	lease := Lease{Owner: "n1", Generation: x.idx}
	// A stale lease changes nothing.
	x.mustFail(ClearGroupRestores{Key: p0, Lease: Lease{Owner: "n2", Generation: x.idx}, Done: []GroupRestore{g0}}, ErrStaleGeneration)
	// Only equal entries of the lease's partition go: g1 is on partition
	// 1, and a g0 replaced by another position stays.
	moved := g0
	moved.SourceOffset = 999
	x.mustApply(ClearGroupRestores{Key: p0, Lease: lease, Done: []GroupRestore{moved, g1}})
	if got := x.state().GroupRestores[k]; !reflect.DeepEqual(got, []GroupRestore{g0, g1, h0}) {
		t.Fatalf("after clearing entries that are not there: %+v", got)
	}
	x.mustApply(ClearGroupRestores{Key: p0, Lease: lease, Done: []GroupRestore{g0, h0}})
	if got := x.state().GroupRestores[k]; !reflect.DeepEqual(got, []GroupRestore{g1}) {
		t.Fatalf("after clearing partition 0: %+v, want only %+v", got, g1)
	}

	x.mustApply(RemoveTopic{Mirror: "m1", Topic: "orders"})
	if _, ok := x.state().GroupRestores[k]; ok {
		t.Fatal("the positions outlived their topic")
	}
	x.mustApply(SetGroupRestores{Mirror: "m2", Topic: "orders", Restores: []GroupRestore{h0}})
	x.mustApply(SetGroupRestores{Mirror: "m1", Topic: "orders", Restores: []GroupRestore{h0}})
	x.mustApply(DeleteMirror{Name: "m2"})
	if _, ok := x.state().GroupRestores[TopicKey("m2", "orders")]; ok {
		t.Fatal("the positions outlived their mirror")
	}
	if _, ok := x.state().GroupRestores[k]; !ok {
		t.Fatal("deleting mirror m2 dropped mirror m1's positions")
	}
	x.mustApply(SetGroupRestores{Mirror: "m1", Topic: "orders"})
	if len(x.state().GroupRestores) != 0 {
		t.Fatalf("an empty SetGroupRestores left %+v", x.state().GroupRestores)
	}
	if err := Authorize(ClearGroupRestores{Key: p0, Done: []GroupRestore{g0}}, ByMember); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a member's clear without its lease: %v, want refused", err)
	}
}

// TestPartitionStateSince: a partition's state change notes the leader's
// append time of its entry and counts FAILED and DIVERGED entries;
// staying in a state keeps the time; a stop keeps why it had failed.
func TestPartitionStateSince(t *testing.T) {
	x := newFixture(t)
	at := func(cmd Command, ms int64) {
		t.Helper()
		b, err := Encode(cmd)
		if err != nil {
			t.Fatal(err)
		}
		x.idx++
		if resp := x.f.Apply(&raft.Log{Index: x.idx, Term: 1, Type: raft.LogCommand, Data: b, AppendedAt: time.UnixMilli(ms)}); resp != nil {
			t.Fatalf("apply %s: %v", cmd.Type(), resp)
		}
	}
	p := func() PartitionInfo {
		pi, _ := x.state().Partition(p1)
		return *pi
	}
	at(Assign{Key: p1, Owner: "n1"}, 500)
	lease := Lease{Owner: "n1", Generation: x.idx}
	at(SetPartitionState{Key: p1, State: StateFailed, Reason: "broker down"}, 1000)
	at(SetPartitionState{Key: p1, State: StateFailed, Reason: "still down"}, 2000)
	if got := p(); got.StateSinceMs != 1000 || got.Failures != 1 {
		t.Fatalf("FAILED twice: since %d failures %d, want 1000 and 1", got.StateSinceMs, got.Failures)
	}
	at(SetPartitionState{Key: p1, State: StateMirroring}, 3000)
	at(SetPartitionState{Key: p1, State: StateDiverged, Reason: "foreign write"}, 4000)
	if got := p(); got.StateSinceMs != 4000 || got.Failures != 2 {
		t.Fatalf("then MIRRORING and DIVERGED: since %d failures %d, want 4000 and 2", got.StateSinceMs, got.Failures)
	}
	at(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping}, 5000)
	lease.Generation = p().Generation // the leader's DIVERGED began a new one
	at(PartitionStopped{Key: p1, Lease: lease, Position: Position{SourceOffset: 10}}, 6000)
	if got := p(); got.State != StateStopped || got.StateSinceMs != 6000 || got.Reason != "stopped while DIVERGED: foreign write" {
		t.Fatalf("stopped while DIVERGED: %+v", got)
	}
}
