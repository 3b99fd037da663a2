package raftstore

import (
	"reflect"
	"testing"
)

// TestFailoverHookRuns: a topic whose last partition stops gets one hook
// run when its mirror has a hook, none without; a topic stopped for the
// same reason before the first attempt joins the run, one after it gets a
// run of its own; attempts are recorded in order, once each, and end the
// run on success or when the leader gives up; a clone shares nothing.
func TestFailoverHookRuns(t *testing.T) {
	x := newFixture(t)
	stop := func(topic, reason string, partitions int, at Position) {
		t.Helper()
		x.mustApply(SetTopicState{Mirror: "m2", Topic: topic, State: StateStopping, Reason: reason})
		for i := range partitions {
			k := PartitionKey{Mirror: "m2", Topic: topic, Partition: int32(i)}
			x.mustApply(Assign{Key: k, Owner: "n1"})
			x.mustApply(PartitionStopped{Key: k, Lease: Lease{Owner: "n1", Generation: x.idx}, Position: at})
		}
	}
	// Without a hook: no run.
	stop("orders", "", 1, Position{SourceOffset: 5, DestinationOffset: 5})
	if runs := x.state().Mirrors["m2"].HookRuns; len(runs) != 0 {
		t.Fatalf("a mirror without a hook got runs %+v", runs)
	}
	x.mustApply(AlterMirror{Name: "m2", Bootstrap: []string{"c:9092"}, Properties: map[string]string{PropFailoverHookURL: "http://dns-switch/x"}})
	for _, topic := range []string{"a", "b", "c"} {
		x.mustApply(AddTopic{Topic: MirrorTopic{Mirror: "m2", Topic: topic, State: StateMirroring,
			Partitions: []PartitionInfo{{State: StateMirroring}, {State: StateMirroring}}}})
	}
	const why = "automatic failover: the source did not answer"
	stop("a", why, 1, Position{SourceOffset: 7, DestinationOffset: 6}) // one partition of two: not a failover yet
	if runs := x.state().Mirrors["m2"].HookRuns; len(runs) != 0 {
		t.Fatalf("a topic with a partition still STOPPING got runs %+v", runs)
	}
	x.mustApply(Assign{Key: PartitionKey{Mirror: "m2", Topic: "a", Partition: 1}, Owner: "n1"})
	x.mustApply(PartitionStopped{Key: PartitionKey{Mirror: "m2", Topic: "a", Partition: 1}, Lease: Lease{Owner: "n1", Generation: x.idx},
		Position: Position{SourceOffset: 9, DestinationOffset: 9}})
	id := x.idx
	stop("b", why, 2, Position{SourceOffset: 3, DestinationOffset: 3})
	runs := x.state().Mirrors["m2"].HookRuns
	want := []HookRun{{ID: id, Topics: []string{"a", "b"}, Reason: why, Positions: map[string][]Position{
		"a": {{SourceOffset: 7, DestinationOffset: 6}, {SourceOffset: 9, DestinationOffset: 9}},
		"b": {{SourceOffset: 3, DestinationOffset: 3}, {SourceOffset: 3, DestinationOffset: 3}},
	}}}
	if !reflect.DeepEqual(runs, want) {
		t.Fatalf("hook runs %+v, want %+v", runs, want)
	}
	c := x.state().Clone()
	c.Mirrors["m2"].HookRuns[0].Positions["a"][0].SourceOffset = 0
	c.Mirrors["m2"].HookRuns[0].Topics[0] = "z"
	if got := x.state().Mirrors["m2"].HookRuns; !reflect.DeepEqual(got, want) {
		t.Fatal("mutating a clone changed the state's hook runs")
	}

	x.mustApply(RecordHookAttempt{Mirror: "m2", ID: id, Attempt: 1, AtMs: 100, Error: "HTTP 503", Succeeded: []string{HookExec}})
	if r := x.state().Mirrors["m2"].HookRuns[0]; r.Done || !reflect.DeepEqual(r.SucceededHooks, []string{HookExec}) {
		t.Fatalf("after the exec hook succeeded and the webhook failed: %+v; want the exec hook recorded as done, the run not", r)
	}
	x.mustFail(RecordHookAttempt{Mirror: "m2", ID: id, Attempt: 1, AtMs: 101, Error: "HTTP 503"}, ErrInvalid) // recorded already
	x.mustFail(RecordHookAttempt{Mirror: "m2", ID: id + 1000, Attempt: 1}, ErrNotFound)
	// The first attempt was made: a topic stopped now gets a run of its own.
	stop("c", why, 2, Position{SourceOffset: 1, DestinationOffset: 1})
	runs = x.state().Mirrors["m2"].HookRuns
	if len(runs) != 2 || !reflect.DeepEqual(runs[1].Topics, []string{"c"}) || runs[0].Attempts != 1 || runs[0].LastError != "HTTP 503" || runs[0].Done {
		t.Fatalf("after an attempt and another stop: %+v", runs)
	}
	x.mustApply(RecordHookAttempt{Mirror: "m2", ID: id, Attempt: 2, AtMs: 200, Succeeded: []string{HookURL}})
	x.mustApply(RecordHookAttempt{Mirror: "m2", ID: runs[1].ID, Attempt: 1, AtMs: 300, Error: "exit status 3", Done: true})
	runs = x.state().Mirrors["m2"].HookRuns
	if r := runs[0]; !r.Done || !r.Succeeded || r.Attempts != 2 || r.LastError != "" || r.LastAttemptMs != 200 ||
		!reflect.DeepEqual(r.SucceededHooks, []string{HookExec, HookURL}) {
		t.Fatalf("run after a successful second attempt: %+v", r)
	}
	if r := runs[1]; !r.Done || r.Succeeded || r.LastError != "exit status 3" {
		t.Fatalf("run the leader gave up on: %+v", r)
	}
	x.mustFail(RecordHookAttempt{Mirror: "m2", ID: id, Attempt: 3, AtMs: 400}, ErrInvalid) // done

	// A topic that joined while the first attempt ran (the attempt
	// announced only "d") moves to a run of its own.
	x.mustApply(AddTopic{Topic: MirrorTopic{Mirror: "m2", Topic: "d", State: StateMirroring, Partitions: []PartitionInfo{{State: StateMirroring}}}})
	x.mustApply(AddTopic{Topic: MirrorTopic{Mirror: "m2", Topic: "e", State: StateMirroring, Partitions: []PartitionInfo{{State: StateMirroring}}}})
	stop("d", "", 1, Position{SourceOffset: 4, DestinationOffset: 4})
	stop("e", "", 1, Position{SourceOffset: 8, DestinationOffset: 8})
	runs = x.state().Mirrors["m2"].HookRuns
	dID := runs[len(runs)-1].ID
	x.mustApply(RecordHookAttempt{Mirror: "m2", ID: dID, Attempt: 1, AtMs: 500, Topics: []string{"d"}})
	runs = x.state().Mirrors["m2"].HookRuns
	d, e := runs[len(runs)-2], runs[len(runs)-1]
	if !reflect.DeepEqual(d.Topics, []string{"d"}) || !d.Succeeded || len(d.Positions) != 1 ||
		!reflect.DeepEqual(e.Topics, []string{"e"}) || e.Attempts != 0 || e.Done || e.Positions["e"][0].SourceOffset != 8 {
		t.Fatalf("after an attempt that announced only d: %+v and %+v, want e in a pending run of its own", d, e)
	}
}

// TestHookRunsBounded: past maxHookRuns the oldest finished runs go,
// pending ones never.
func TestHookRunsBounded(t *testing.T) {
	s := NewState()
	s.Mirrors["m"] = &Mirror{Name: "m", Properties: map[string]string{PropFailoverHookExec: "switch-dns"}}
	for i := range maxHookRuns + 5 {
		s.noteFailover(&MirrorTopic{Mirror: "m", Topic: "t", Reason: string(rune('a' + i))}, uint64(i+1))
		if i%2 == 0 {
			r := &s.Mirrors["m"].HookRuns[len(s.Mirrors["m"].HookRuns)-1]
			r.Done = true
		}
	}
	runs := s.Mirrors["m"].HookRuns
	if len(runs) != maxHookRuns {
		t.Fatalf("%d runs kept, want %d", len(runs), maxHookRuns)
	}
	pending := 0
	for _, r := range runs {
		if !r.Done {
			pending++
		}
	}
	if pending != (maxHookRuns+5)/2 {
		t.Fatalf("%d pending runs kept, want every one of %d", pending, (maxHookRuns+5)/2)
	}
}
