package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// TestApplyInternalTakesMemberCommands: the leader's internal route takes
// every command the command table lets a member submit, RecordGap among
// them (a follower that skipped an accepted gap records it through it),
// and refuses an operator's command.
func TestApplyInternalTakesMemberCommands(t *testing.T) {
	g, m, key := ownedPartition(t)
	ctx := context.Background()
	if err := m.store.Apply(ctx, raftstore.SetPartitionState{Key: key, State: raftstore.StateDiverged, Reason: "a gap"}); err != nil {
		t.Fatal(err)
	}
	if err := m.store.Apply(ctx, raftstore.ResumePartition{Key: key, AcceptGap: true}); err != nil {
		t.Fatal(err)
	}
	info := g.partitions(0)[key]
	entry, err := raftstore.Encode(raftstore.RecordGap{Key: key, Lease: raftstore.Lease{Owner: info.Owner, Generation: info.Generation}, From: 10, To: 15})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); err != nil {
		t.Fatalf("a member's RecordGap through /v1/internal/apply: %v", err)
	}
	if got := g.partitions(0)[key]; got.SkippedRecords != 5 {
		t.Fatalf("skipped records %d after the recorded gap, want 5", got.SkippedRecords)
	}
	entry, err = raftstore.Encode(raftstore.ResumePartition{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ApplyInternal(ctx, entry); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("an operator's ResumePartition through /v1/internal/apply: %v, want refused", err)
	}
}

// ownedPartition starts a one-member group with one MIRRORING partition
// (m/t/0) and waits until the member owns it.
func ownedPartition(t *testing.T) (*group, *Member, raftstore.PartitionKey) {
	t.Helper()
	g := newGroup(t, 1, 2*time.Second)
	g.addTopic("t", 1)
	m := g.leader()
	key := raftstore.PartitionKey{Mirror: "m", Topic: "t", Partition: 0}
	waitFor(t, 10*time.Second, "the partition owned by "+m.cfg.NodeID, func() bool {
		info := g.partitions(0)[key]
		return info.Owner == m.cfg.NodeID && info.State == raftstore.StateMirroring
	})
	return g, m, key
}
