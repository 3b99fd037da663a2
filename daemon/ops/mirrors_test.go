package ops

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

func TestSummarise(t *testing.T) {
	m, st, f := raftstore.StateMirroring, raftstore.StateStopped, raftstore.StateFailed
	cases := []struct {
		states []raftstore.TopicState
		want   string
	}{
		{nil, "EMPTY"},
		{[]raftstore.TopicState{m, m}, "MIRRORING"},
		{[]raftstore.TopicState{m, st}, "MIRRORING"}, // a removed topic is not a problem of the mirror
		{[]raftstore.TopicState{st, st}, "STOPPED"},
		{[]raftstore.TopicState{m, f, st}, "FAILED"},
	}
	for _, c := range cases {
		if got := summarise(c.states); got != c.want {
			t.Errorf("summarise(%v) = %s, want %s", c.states, got, c.want)
		}
	}
}

func TestStaleness(t *testing.T) {
	for _, tc := range []struct {
		st   api.LiveStatus
		want string
	}{
		{api.LiveStatus{SourceAgeMs: 300}, ""},
		{api.LiveStatus{SourceAgeMs: 300, FetchWaitMs: 9000, ProduceWaitMs: 2000}, ""},
		{api.LiveStatus{SourceAgeMs: 26400, FetchWaitMs: 26000},
			"stale: source offset as of 26s ago: owner m2 has waited 26s for the source leader to answer a fetch, so the lag is unknown"},
		{api.LiveStatus{SourceAgeMs: -1, FetchWaitMs: 12000}, "stale: source offset never fetched: owner m2 has waited 12s"},
		{api.LiveStatus{SourceAgeMs: 100, ProduceWaitMs: 15000}, "stale: owner m2 has waited 15s for the destination to answer a produce"},
	} {
		got := staleness(tc.st, "m2")
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("staleness(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}

// applied records the commands that reach the store.
type appliedStore struct {
	Store
	got []raftstore.Command
}

func (s *appliedStore) Apply(_ context.Context, cmd raftstore.Command) error {
	s.got = append(s.got, cmd)
	return nil
}

// TestOpsApplyOnlyOperatorCommands: the verbs' store takes only what the
// command table lets an operator submit (issue 17: Apply checks the
// table's authority for every submitter, not only members).
func TestOpsApplyOnlyOperatorCommands(t *testing.T) {
	st := &appliedStore{}
	o := New(Config{}, st, nil, nil, nil, nil, nil)
	ctx := context.Background()
	if err := o.store.Apply(ctx, raftstore.ResumePartition{Key: raftstore.PartitionKey{Mirror: "m", Topic: "t"}}); err != nil {
		t.Fatalf("an operator's ResumePartition: %v", err)
	}
	for _, cmd := range []raftstore.Command{
		raftstore.SetProducer{Owner: "n1", Generation: 1},
		raftstore.AssignPartitions{},
	} {
		if err := o.store.Apply(ctx, cmd); !errors.Is(err, raftstore.ErrInvalid) {
			t.Errorf("the verbs applying %s: %v, want refused", cmd.Type(), err)
		}
	}
	if len(st.got) != 1 {
		t.Fatalf("%d commands reached the store, want only the operator's one", len(st.got))
	}
}
