package raftstore

import (
	"errors"
	"reflect"
	"testing"
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
