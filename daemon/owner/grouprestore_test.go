package owner

import (
	"context"
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// TestRestoreWaitsForUnreadSource: a kept position of a group whose
// source commits could not be read this round is neither given back nor
// cleared (the source may hold a position that must win: a review found a
// failed OffsetFetch let the kept one overwrite it); one the source's
// commit governs is cleared without a commit. Neither reaches the
// destination, which this test has none of.
func TestRestoreWaitsForUnreadSource(t *testing.T) {
	o, store, _ := ownedPartition(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kept := raftstore.GroupRestore{Group: "app", Partition: 0, DestinationCommitted: 1050, SourceOffset: 1000}
	if err := store.Apply(ctx, raftstore.SetGroupRestores{Mirror: "m", Topic: "t", Restores: []raftstore.GroupRestore{kept}}); err != nil {
		t.Fatal(err)
	}
	keys := []fetch.Key{{Mirror: "m", Topic: "t", Partition: 0}}
	g := o.groups
	if rows := g.restore(ctx, "m", keys, nil, map[groupRowKey]bool{}, map[string]bool{"app": true}, nil); len(rows) != 0 {
		t.Fatalf("rows for a group whose source was not read: %+v", rows)
	}
	left := func() int {
		n := 0
		store.Read(func(s *raftstore.State) { n = len(s.GroupRestores[raftstore.TopicKey("m", "t")]) })
		return n
	}
	if left() != 1 {
		t.Fatal("the kept position of a group whose source was not read went")
	}
	governed := map[groupRowKey]bool{{"m", "app", "t", 0}: true}
	if rows := g.restore(ctx, "m", keys, nil, governed, map[string]bool{}, nil); len(rows) != 0 {
		t.Fatalf("rows for a group the source's commit governs: %+v", rows)
	}
	if left() != 0 {
		t.Fatal("the kept position the source's commit governs was not cleared")
	}
}
