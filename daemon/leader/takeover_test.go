package leader

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// takeoverStore is an inputsStore that records takeover marks.
type takeoverStore struct {
	inputsStore
	events []string
}

func (s *takeoverStore) BeginTakeover(id string) func() {
	s.events = append(s.events, "mark "+id)
	return func() { s.events = append(s.events, "unmark "+id) }
}

// TestTakeoverFencesGrants: before a takeover's entry goes to raft, lease
// grants to the member taken over stop and its lease is checked once more
// (in that order, so a grant is either seen by the check or refused); a
// member that renewed since the plan keeps its partitions, while the
// other assignments of the round go ahead; the marks end when the entry
// does (seen in the tier test, seed 1796498214572579819: the member was
// granted a lease between the plan and the commit, and wrote 0.5 s into
// its successor's generation).
func TestTakeoverFencesGrants(t *testing.T) {
	key := func(i int32) raftstore.PartitionKey {
		return raftstore.PartitionKey{Mirror: "m", Topic: "t", Partition: i}
	}
	st := &raftstore.State{Topics: map[string]*raftstore.MirrorTopic{raftstore.TopicKey("m", "t"): {Mirror: "m", Topic: "t",
		Partitions: []raftstore.PartitionInfo{{Owner: "n2", Generation: 7}, {Owner: "n3", Generation: 8}, {Generation: 9}}}}}
	store := &takeoverStore{inputsStore: inputsStore{state: st}}
	l := New(context.Background(), Config{NodeID: "n1", LeaseTTL: 3 * time.Second}, store, nil, nil, zap.NewNop())
	plan := []raftstore.Assignment{
		{Key: key(0), Owner: "n1", From: 7, Takeover: true},
		{Key: key(1), Owner: "n1", From: 8, Takeover: true},
		{Key: key(2), Owner: "n1", From: 9}, // unowned: no takeover
	}
	alive := func(id string) bool {
		if len(store.events) == 0 {
			t.Fatalf("the lease of %s was checked before grants to it stopped", id)
		}
		return id == "n3" // n3 renewed after the plan was made
	}
	kept, end := l.fenceTakeovers(plan, alive)
	if len(kept) != 2 || kept[0].Key != key(0) || kept[1].Key != key(2) {
		t.Fatalf("kept %+v; want the takeover from n2 and the unowned partition, not the takeover from n3, who renewed", kept)
	}
	end()
	want := []string{"mark n2", "mark n3", "unmark n2", "unmark n3"}
	if len(store.events) != len(want) {
		t.Fatalf("marks %v, want %v", store.events, want)
	}
	for i := range want {
		if store.events[i] != want[i] {
			t.Fatalf("marks %v, want %v", store.events, want)
		}
	}
}
