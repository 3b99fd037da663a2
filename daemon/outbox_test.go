package daemon

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// TestReportAfterLateFailure: a partition fails and recovers while its
// FAILED report is still being applied. This member's copy of the state
// does not show FAILED yet when the recovery is reported, so that copy alone
// would call the MIRRORING report already told; the FAILED report then lands
// and describe would show FAILED for good for a partition that mirrors
// (seen on a loaded machine: TestGroupTakeoverConnections). The recovery
// must reach the replicated state after the failure does.
func TestReportAfterLateFailure(t *testing.T) {
	g, m, key := ownedPartition(t)
	c := &control{m: m}
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}

	c.Report(k, fetch.Failed, "fetch from destination cluster t/0: kafka error 6", 0)
	m.out.mu.Lock()
	inFlight := m.out.cmds["state "+k.String()].cmd // what flush is submitting
	m.out.mu.Unlock()
	if inFlight == nil {
		t.Fatal("the FAILED report was not put in the outbox")
	}
	c.Report(k, fetch.Mirroring, "", 0) // the local state still shows MIRRORING
	if err := m.store.Apply(context.Background(), inFlight); err != nil {
		t.Fatal(err)
	}
	m.out.flush()
	if got := g.partitions(0)[key]; got.State != raftstore.StateMirroring || got.Reason != "" {
		t.Fatalf("after the late FAILED report and the recovery, the replicated state shows %s %q; want MIRRORING", got.State, got.Reason)
	}

	// A report that says what the replicated state and the last report say
	// already is not sent again.
	c.Report(k, fetch.Mirroring, "", 0)
	m.out.mu.Lock()
	waiting := len(m.out.cmds)
	m.out.mu.Unlock()
	if waiting != 0 {
		t.Fatalf("%d commands waiting after a report of the state already told", waiting)
	}
}

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
