package raftstore

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// fixture drives an FSM through Apply of encoded raft logs, as raft does.
type fixture struct {
	t   *testing.T
	f   *FSM
	idx uint64
}

// newFixture returns an FSM holding mirror "m1" (topic "orders", 3
// PENDING partitions), mirror "m2" (topic "orders", 1 partition) and
// member "n1".
func newFixture(t *testing.T) *fixture {
	t.Helper()
	x := &fixture{t: t, f: NewFSM()}
	x.mustApply(CreateMirror{Mirror: Mirror{Name: "m1", Bootstrap: []string{"a:9092", "b:9092"}, Properties: map[string]string{"security.protocol": "SSL"}, SourceClusterID: "src-1"}})
	x.mustApply(CreateMirror{Mirror: Mirror{Name: "m2", Bootstrap: []string{"c:9092"}}})
	x.mustApply(AddTopic{Topic: MirrorTopic{
		Mirror: "m1", Topic: "orders", State: StatePending, SourceTopicID: "tid-1",
		Partitions: []PartitionInfo{
			{State: StatePending, StartOffset: 0},
			{State: StatePending, StartOffset: 10},
			{State: StatePending, StartOffset: 20},
		},
	}})
	x.mustApply(AddTopic{Topic: MirrorTopic{Mirror: "m2", Topic: "orders", State: StatePending, Partitions: []PartitionInfo{{State: StatePending}}}})
	x.mustApply(UpsertMember{Member: Member{ID: "n1", RaftAddr: "h1:7000", HTTPAddr: "h1:8080", Voter: true}})
	return x
}

func (x *fixture) apply(cmd Command) error {
	x.t.Helper()
	b, err := Encode(cmd)
	if err != nil {
		x.t.Fatalf("encode %s: %v", cmd.Type(), err)
	}
	x.idx++
	resp := x.f.Apply(&raft.Log{Index: x.idx, Term: 1, Type: raft.LogCommand, Data: b})
	if got := x.state().Index; got != x.idx {
		x.t.Fatalf("state index %d after applying log %d", got, x.idx)
	}
	if resp == nil {
		return nil
	}
	err, ok := resp.(error)
	if !ok {
		x.t.Fatalf("apply %s: response %T(%v) is not an error", cmd.Type(), resp, resp)
	}
	return err
}

func (x *fixture) mustApply(cmd Command) {
	x.t.Helper()
	if err := x.apply(cmd); err != nil {
		x.t.Fatalf("apply %s: %v", cmd.Type(), err)
	}
}

// mustFail applies cmd, expects an error wrapping want, and checks that
// nothing but the applied index changed.
func (x *fixture) mustFail(cmd Command, want error) {
	x.t.Helper()
	before := x.state()
	err := x.apply(cmd)
	if !errors.Is(err, want) {
		x.t.Fatalf("apply %s: got error %v, want %v", cmd.Type(), err, want)
	}
	after := x.state()
	before.Index = after.Index
	if !reflect.DeepEqual(before, after) {
		x.t.Fatalf("apply %s failed (%v) but changed the state", cmd.Type(), err)
	}
}

func (x *fixture) state() *State {
	var s *State
	x.f.Read(func(st *State) { s = st.Clone() })
	return s
}

func (x *fixture) topic(mirror, topic string) *MirrorTopic {
	x.t.Helper()
	t, ok := x.state().Topic(mirror, topic)
	if !ok {
		x.t.Fatalf("topic %s missing", TopicKey(mirror, topic))
	}
	return t
}

var p1 = PartitionKey{Mirror: "m1", Topic: "orders", Partition: 1}

func TestApplyCreateMirror(t *testing.T) {
	x := newFixture(t)
	m := Mirror{Name: "m3", Bootstrap: []string{"d:9092"}, Properties: map[string]string{"sasl.mechanism": "PLAIN"}}
	x.mustApply(CreateMirror{Mirror: m})
	if got := x.state().Mirrors["m3"]; !reflect.DeepEqual(got, &m) {
		t.Fatalf("mirror m3 = %+v, want %+v", got, m)
	}
	x.mustFail(CreateMirror{Mirror: Mirror{Name: "m1"}}, ErrExists)
	x.mustFail(CreateMirror{Mirror: Mirror{Name: ""}}, ErrInvalid)
	x.mustFail(CreateMirror{Mirror: Mirror{Name: "a/b"}}, ErrInvalid)
}

func TestApplyAlterMirror(t *testing.T) {
	x := newFixture(t)
	props := map[string]string{"bootstrap.servers": "e:9092", "groups.include": "orders-.*"}
	x.mustApply(AlterMirror{Name: "m1", Bootstrap: []string{"e:9092"}, Properties: props})
	got := x.state().Mirrors["m1"]
	want := &Mirror{Name: "m1", Bootstrap: []string{"e:9092"}, Properties: props, SourceClusterID: "src-1"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("altered mirror m1 = %+v, want %+v (name and cluster ID kept)", got, want)
	}
	x.mustFail(AlterMirror{Name: "nope", Bootstrap: []string{"e:9092"}}, ErrNotFound)
	x.mustFail(AlterMirror{Name: "m1"}, ErrInvalid)
}

// TestApplyTopicPatterns: patterns replace the mirror's, survive an
// alter of its connection, and clearing the include list clears the
// skipped topics (nothing matches any more).
func TestApplyTopicPatterns(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicPatterns{Name: "m1", Include: []string{"orders\\..*", "pay.*"}, Exclude: []string{".*-tmp"}})
	x.mustApply(SetDiscoverySkips{Name: "m1", Skipped: map[string]string{"orders.a": "mirrored by mirror m2"}})
	x.mustApply(AlterMirror{Name: "m1", Bootstrap: []string{"e:9092"}})
	got := x.state().Mirrors["m1"]
	if !reflect.DeepEqual(got.Include, []string{"orders\\..*", "pay.*"}) || !reflect.DeepEqual(got.Exclude, []string{".*-tmp"}) ||
		got.Skipped["orders.a"] != "mirrored by mirror m2" {
		t.Fatalf("mirror m1 after patterns, skips and an alter: %+v", got)
	}
	if c := got.Clone(); &c.Include[0] == &got.Include[0] {
		t.Fatal("Clone shares the include list")
	}
	x.mustApply(SetTopicPatterns{Name: "m1", Exclude: []string{".*-tmp"}})
	if got := x.state().Mirrors["m1"]; got.Include != nil || got.Skipped != nil || len(got.Exclude) != 1 {
		t.Fatalf("mirror m1 with no include pattern: %+v, want no includes and no skipped topics", got)
	}
	x.mustFail(SetTopicPatterns{Name: "nope"}, ErrNotFound)
	x.mustFail(SetDiscoverySkips{Name: "nope"}, ErrNotFound)
}

func TestApplySetWriteDenials(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetWriteDenials{Topic: "orders", Principals: []string{"User:b", "User:a", "User:b"}})
	if got := x.state().WriteDenials["orders"]; !reflect.DeepEqual(got, []string{"User:a", "User:b"}) {
		t.Fatalf("denials %v, want sorted and unique", got)
	}
	if c := x.state().Clone(); !reflect.DeepEqual(c.WriteDenials, x.state().WriteDenials) {
		t.Fatalf("clone lost the denials: %v", c.WriteDenials)
	}
	x.mustApply(SetWriteDenials{Topic: "orders"})
	if _, ok := x.state().WriteDenials["orders"]; ok {
		t.Fatal("an empty list did not remove the record")
	}
	x.mustFail(SetWriteDenials{Principals: []string{"User:a"}}, ErrInvalid)
}

func TestApplyDeleteMirror(t *testing.T) {
	x := newFixture(t)
	x.mustApply(DeleteMirror{Name: "m1"})
	s := x.state()
	if _, ok := s.Mirrors["m1"]; ok {
		t.Fatal("mirror m1 still present")
	}
	if _, ok := s.Topic("m1", "orders"); ok {
		t.Fatal("topic m1/orders survived its mirror")
	}
	if _, ok := s.Topic("m2", "orders"); !ok {
		t.Fatal("topic m2/orders of another mirror was deleted")
	}
	x.mustFail(DeleteMirror{Name: "m1"}, ErrNotFound)
}

func TestApplyAddTopic(t *testing.T) {
	x := newFixture(t)
	mt := MirrorTopic{Mirror: "m1", Topic: "payments", State: StatePending, SourceTopicID: "tid-2",
		Partitions: []PartitionInfo{{State: StatePending, StartOffset: 42}}}
	x.mustApply(AddTopic{Topic: mt})
	if got := x.topic("m1", "payments"); !reflect.DeepEqual(got, &mt) {
		t.Fatalf("topic = %+v, want %+v", got, mt)
	}
	x.mustFail(AddTopic{Topic: MirrorTopic{Mirror: "nope", Topic: "x", State: StatePending}}, ErrNotFound)
	x.mustFail(AddTopic{Topic: MirrorTopic{Mirror: "m1", Topic: "orders", State: StatePending}}, ErrExists)
	x.mustFail(AddTopic{Topic: MirrorTopic{Mirror: "m1", Topic: "", State: StatePending}}, ErrInvalid)
	x.mustFail(AddTopic{Topic: MirrorTopic{Mirror: "m1", Topic: "y", State: "BOGUS"}}, ErrInvalid)
}

func TestApplySetTopicState(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetPartitionState{Key: p1, State: StateDiverged, Reason: "source truncated"})

	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring, DestTopicID: "dest-1"})
	mt := x.topic("m1", "orders")
	if mt.State != StateMirroring || mt.DestTopicID != "dest-1" {
		t.Fatalf("topic state %s dest %q, want MIRRORING dest-1", mt.State, mt.DestTopicID)
	}
	wantParts := []TopicState{StateMirroring, StateDiverged, StateMirroring}
	for i, p := range mt.Partitions {
		if p.State != wantParts[i] {
			t.Fatalf("partition %d state %s, want %s", i, p.State, wantParts[i])
		}
	}
	if mt.Partitions[1].Reason != "source truncated" {
		t.Fatalf("DIVERGED partition lost its reason: %q", mt.Partitions[1].Reason)
	}

	// An empty DestTopicID keeps the recorded one.
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StatePaused, Reason: "operator"})
	mt = x.topic("m1", "orders")
	if mt.DestTopicID != "dest-1" || mt.State != StatePaused || mt.Reason != "operator" || mt.Partitions[0].State != StatePaused {
		t.Fatalf("after PAUSED: %+v", mt)
	}

	// FAILED and DIVERGED describe the topic only.
	for _, st := range []TopicState{StateFailed, StateDiverged} {
		x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: st, Reason: "why"})
		mt = x.topic("m1", "orders")
		if mt.State != st || mt.Reason != "why" {
			t.Fatalf("topic state %s reason %q, want %s why", mt.State, mt.Reason, st)
		}
		if mt.Partitions[0].State != StatePaused || mt.Partitions[2].State != StatePaused {
			t.Fatalf("%s changed partition states: %+v", st, mt.Partitions)
		}
	}

	x.mustFail(SetTopicState{Mirror: "m1", Topic: "nope", State: StateMirroring}, ErrNotFound)
	x.mustFail(SetTopicState{Mirror: "m1", Topic: "orders", State: ""}, ErrInvalid)
}

func TestApplySetPartitionState(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetPartitionState{Key: p1, State: StateFailed, Reason: "produce: timeout"})
	mt := x.topic("m1", "orders")
	if p := mt.Partitions[1]; p.State != StateFailed || p.Reason != "produce: timeout" {
		t.Fatalf("partition 1 = %+v", p)
	}
	if mt.State != StatePending || mt.Partitions[0].State != StatePending {
		t.Fatal("SetPartitionState touched the topic or another partition")
	}
	x.mustFail(SetPartitionState{Key: PartitionKey{Mirror: "m1", Topic: "nope"}, State: StateMirroring}, ErrNotFound)
	x.mustFail(SetPartitionState{Key: PartitionKey{Mirror: "m1", Topic: "orders", Partition: 3}, State: StateMirroring}, ErrNotFound)
	x.mustFail(SetPartitionState{Key: PartitionKey{Mirror: "m1", Topic: "orders", Partition: -1}, State: StateMirroring}, ErrNotFound)
	x.mustFail(SetPartitionState{Key: p1, State: "BOGUS"}, ErrInvalid)
}

func TestApplyAssign(t *testing.T) {
	x := newFixture(t)
	// The generation is the raft index of the assignment: it never repeats.
	for i, owner := range []string{"n1", "n2", ""} {
		x.mustApply(Assign{Key: p1, Owner: owner})
		p, _ := x.state().Partition(p1)
		if p.Owner != owner || p.Generation != x.idx {
			t.Fatalf("after assign %d: owner %q generation %d, want %q %d", i, p.Owner, p.Generation, owner, x.idx)
		}
	}
	if p, _ := x.state().Partition(PartitionKey{Mirror: "m1", Topic: "orders"}); p.Generation != 0 {
		t.Fatalf("partition 0 generation %d, want 0", p.Generation)
	}
	x.mustFail(Assign{Key: PartitionKey{Mirror: "m9", Topic: "orders"}, Owner: "n1"}, ErrNotFound)
	x.mustFail(Assign{Key: PartitionKey{Mirror: "m1", Topic: "orders", Partition: 7}, Owner: "n1"}, ErrNotFound)
}

func TestApplySetProducer(t *testing.T) {
	x := newFixture(t)
	x.mustApply(Assign{Key: p1, Owner: "n1"})
	old := x.idx
	x.mustApply(Assign{Key: p1, Owner: "n2"})
	gen := x.idx
	id := ProducerIdentity{ProducerID: 4711, Epoch: 3}
	x.mustApply(SetProducer{Key: p1, Producer: id, Generation: gen, Owner: "n2"})
	if p, _ := x.state().Partition(p1); p.Producer != id {
		t.Fatalf("producer %+v, want %+v", p.Producer, id)
	}
	x.mustFail(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 1}, Generation: old}, ErrStaleGeneration)
	x.mustFail(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 1}, Generation: gen + 1}, ErrStaleGeneration)
	x.mustFail(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 1}, Generation: gen, Owner: "n1"}, ErrStaleGeneration)
	x.mustFail(SetProducer{Key: PartitionKey{Mirror: "m1", Topic: "nope"}, Generation: 0}, ErrNotFound)
}

func TestApplyRecordStopped(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping})
	x.mustApply(Assign{Key: p1, Owner: "n1"})
	pos := []Position{
		{SourceOffset: 5, DestinationOffset: 5, SourceLeaderEpoch: 1, SourceClusterID: "src-1", SourceTopicID: "tid-1"},
		{SourceOffset: 15, DestinationOffset: 5, SourceLeaderEpoch: 2, SourceClusterID: "src-1", SourceTopicID: "tid-1"},
		{SourceOffset: 20, DestinationOffset: 0, SourceLeaderEpoch: 2, SourceClusterID: "src-1", SourceTopicID: "tid-1"},
	}
	x.mustApply(RecordStopped{Mirror: "m1", Topic: "orders", Positions: pos})
	mt := x.topic("m1", "orders")
	if mt.State != StateStopped {
		t.Fatalf("topic state %s, want STOPPED", mt.State)
	}
	for i, p := range mt.Partitions {
		if p.State != StateStopped || p.Owner != "" || p.LastMirrored == nil || *p.LastMirrored != pos[i] {
			t.Fatalf("partition %d = %+v, want STOPPED, unowned, at %+v", i, p, pos[i])
		}
	}
	// Stopping is an assignment change: every partition's generation is
	// the index of RecordStopped, which fences n1.
	if mt.Partitions[1].Generation != x.idx || mt.Partitions[0].Generation != x.idx {
		t.Fatalf("generations %d %d, want %d", mt.Partitions[0].Generation, mt.Partitions[1].Generation, x.idx)
	}
	x.mustFail(RecordStopped{Mirror: "m1", Topic: "nope", Positions: pos}, ErrNotFound)
	x.mustFail(RecordStopped{Mirror: "m1", Topic: "orders", Positions: pos[:2]}, ErrInvalid)
}

func TestApplyUpsertMember(t *testing.T) {
	x := newFixture(t)
	m := Member{ID: "n2", RaftAddr: "h2:7000", HTTPAddr: "h2:8080"}
	x.mustApply(UpsertMember{Member: m})
	m.Voter, m.Draining = true, true
	x.mustApply(UpsertMember{Member: m})
	if got := x.state().Members["n2"]; !reflect.DeepEqual(got, &m) {
		t.Fatalf("member n2 = %+v, want %+v", got, m)
	}
	x.mustFail(UpsertMember{Member: Member{RaftAddr: "h3:7000"}}, ErrInvalid)
	// The member's announced lease_ttl survives a record that does not
	// carry one (an operator's repeated add, an older build).
	m.LeaseTTLMs = 30000
	x.mustApply(UpsertMember{Member: m})
	x.mustApply(UpsertMember{Member: Member{ID: "n2", RaftAddr: "h2:7000", HTTPAddr: "h2:8080", Voter: true, Draining: true}})
	if got := x.state().Members["n2"]; !reflect.DeepEqual(got, &m) {
		t.Fatalf("member n2 = %+v, want the announced lease_ttl kept: %+v", got, m)
	}
	// IfAbsent adds only: n2's record (Voter, Draining) stays.
	x.mustApply(UpsertMember{Member: Member{ID: "n2", RaftAddr: "other:1"}, IfAbsent: true})
	if got := x.state().Members["n2"]; !reflect.DeepEqual(got, &m) {
		t.Fatalf("IfAbsent replaced n2: %+v", got)
	}
	x.mustApply(UpsertMember{Member: Member{ID: "n3"}, IfAbsent: true})
	if _, ok := x.state().Members["n3"]; !ok {
		t.Fatal("IfAbsent did not add n3")
	}
}

func TestApplyRemoveMember(t *testing.T) {
	x := newFixture(t)
	x.mustApply(RemoveMember{ID: "n1"})
	if _, ok := x.state().Members["n1"]; ok {
		t.Fatal("member n1 still present")
	}
	x.mustFail(RemoveMember{ID: "n1"}, ErrNotFound)
}

func TestApplyRemoveTopic(t *testing.T) {
	x := newFixture(t)
	x.mustApply(RemoveTopic{Mirror: "m1", Topic: "orders"})
	s := x.state()
	if _, ok := s.Topic("m1", "orders"); ok {
		t.Fatal("topic m1/orders still present")
	}
	if _, ok := s.Mirrors["m1"]; !ok {
		t.Fatal("RemoveTopic removed the mirror")
	}
	x.mustFail(RemoveTopic{Mirror: "m1", Topic: "orders"}, ErrNotFound)
}

func TestApplyUndecodablePanics(t *testing.T) {
	cases := map[string][]byte{
		"unknown type":            {0x7F, 1, '{', '}'},
		"unknown payload version": {byte(TypeCreateMirror), 2, '{', '}'},
		"empty entry":             {},
		"bad JSON":                {byte(TypeCreateMirror), 1, '{'},
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			f := NewFSM()
			defer func() {
				r := recover()
				if r == nil {
					t.Fatal("Apply did not panic")
				}
				if !strings.Contains(r.(error).Error(), "raft log entry 7") {
					t.Fatalf("panic %q does not name the log entry", r)
				}
			}()
			f.Apply(&raft.Log{Index: 7, Type: raft.LogCommand, Data: data})
		})
	}
}

func TestApplyUnknownIgnorableSkipped(t *testing.T) {
	x := newFixture(t)
	before := x.state()
	for _, data := range [][]byte{
		{0x80 | 0x05, 1, '{', '}'},
		{0xFE, 9, 'x'}, // an unknown type's payload version and body are not ours to judge
	} {
		x.idx++
		if resp := x.f.Apply(&raft.Log{Index: x.idx, Type: raft.LogCommand, Data: data}); resp != nil {
			t.Fatalf("ignorable entry %x: response %v, want nil", data, resp)
		}
	}
	after := x.state()
	if after.Index != x.idx {
		t.Fatalf("index %d, want %d", after.Index, x.idx)
	}
	before.Index = after.Index
	if !reflect.DeepEqual(before, after) {
		t.Fatal("skipping an ignorable entry changed the state")
	}
}

func TestWatch(t *testing.T) {
	x := newFixture(t)
	ch, cancel := x.f.Watch()
	other, cancelOther := x.f.Watch()
	defer cancelOther()

	x.mustApply(UpsertMember{Member: Member{ID: "n2"}})
	x.mustFail(RemoveMember{ID: "n9"}, ErrNotFound) // a refused command moves Index too
	for _, c := range []<-chan struct{}{ch, other} {
		select {
		case <-c:
		case <-time.After(5 * time.Second):
			t.Fatal("no notification after apply")
		}
	}
	// Two applies coalesce into one pending notification.
	select {
	case <-ch:
		t.Fatal("second notification pending; want them coalesced")
	default:
	}

	cancel()
	x.mustApply(RemoveMember{ID: "n2"})
	select {
	case <-ch:
		t.Fatal("notification after cancel")
	default:
	}
	select {
	case <-other:
	default:
		t.Fatal("remaining watcher missed a change")
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	cmds := []Command{
		CreateMirror{Mirror: Mirror{Name: "m", Bootstrap: []string{"a:1"}, Properties: map[string]string{"k": "v"}, SourceClusterID: "c"}},
		DeleteMirror{Name: "m"},
		AddTopic{Topic: MirrorTopic{Mirror: "m", Topic: "t", State: StatePending, Partitions: []PartitionInfo{{State: StatePending, StartOffset: 3}}}},
		SetTopicState{Mirror: "m", Topic: "t", State: StateFailed, Reason: "r", DestTopicID: "d"},
		SetPartitionState{Key: PartitionKey{Mirror: "m", Topic: "t", Partition: 2}, State: StatePaused, Reason: "r"},
		Assign{Key: PartitionKey{Mirror: "m", Topic: "t", Partition: 2}, Owner: "n1"},
		SetProducer{Key: PartitionKey{Mirror: "m", Topic: "t"}, Producer: ProducerIdentity{ProducerID: 9, Epoch: 1}, Generation: 4},
		RecordStopped{Mirror: "m", Topic: "t", Positions: []Position{{SourceOffset: 1, DestinationOffset: 2, SourceLeaderEpoch: 3, SourceClusterID: "c", SourceTopicID: "i"}}},
		UpsertMember{Member: Member{ID: "n1", RaftAddr: "r", HTTPAddr: "h", Voter: true, Draining: true}},
		RemoveMember{ID: "n1"},
		RemoveTopic{Mirror: "m", Topic: "t"},
	}
	seen := make(map[CommandType]bool)
	for _, cmd := range cmds {
		b, err := Encode(cmd)
		if err != nil {
			t.Fatalf("encode %s: %v", cmd.Type(), err)
		}
		if CommandType(b[0]) != cmd.Type() || b[1] != 1 {
			t.Fatalf("%s header %x, want type %d version 1", cmd.Type(), b[:2], cmd.Type())
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("decode %s: %v", cmd.Type(), err)
		}
		if !reflect.DeepEqual(got, cmd) {
			t.Fatalf("round trip of %s: got %#v, want %#v", cmd.Type(), got, cmd)
		}
		seen[cmd.Type()] = true
	}
	for ct := CommandType(1); ct <= TypeRemoveTopic; ct++ {
		if !seen[ct] {
			t.Errorf("command type %s has no round-trip case", ct)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	if _, err := Decode([]byte{1}); err == nil {
		t.Fatal("one-byte entry decoded")
	}
	if _, err := Decode([]byte{0x42, 1, '{', '}'}); !errors.Is(err, ErrUnknownCommand) {
		t.Fatalf("unknown type: %v, want ErrUnknownCommand", err)
	}
	if _, err := Decode([]byte{byte(TypeAssign), 0, '{', '}'}); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("unknown version: %v, want ErrUnknownVersion", err)
	}
}

func TestStateCloneIsDeep(t *testing.T) {
	x := newFixture(t)
	x.mustApply(RecordStopped{Mirror: "m2", Topic: "orders", Positions: []Position{{SourceOffset: 1}}})
	orig := x.state()
	c := orig.Clone()
	if !reflect.DeepEqual(orig, c) {
		t.Fatal("clone differs from original")
	}
	c.Mirrors["m1"].Bootstrap[0] = "changed"
	c.Mirrors["m1"].Properties["security.protocol"] = "changed"
	mt, _ := c.Topic("m2", "orders")
	mt.Partitions[0].LastMirrored.SourceOffset = 99
	mt.Partitions[0].Owner = "changed"
	c.Members["n1"].Draining = true
	if !reflect.DeepEqual(orig, x.state()) {
		t.Fatal("mutating the clone changed the original")
	}
}

func TestApplyAddPartitions(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustFail(AddPartitions{Mirror: "m1", Topic: "orders", Partitions: 5, StartOffsets: []int64{0}}, ErrInvalid)
	x.mustFail(AddPartitions{Mirror: "m1", Topic: "nope", Partitions: 5, StartOffsets: []int64{0, 0}}, ErrNotFound)
	x.mustApply(AddPartitions{Mirror: "m1", Topic: "orders", Partitions: 5, StartOffsets: []int64{0, 7}})
	ps := x.topic("m1", "orders").Partitions
	if len(ps) != 5 || ps[3].State != StateMirroring || ps[4].StartOffset != 7 || ps[3].Owner != "" || ps[3].Generation != x.idx {
		t.Fatalf("partitions after growing to 5: %+v", ps)
	}
	// A leader repeating the command after a crash changes nothing.
	before := x.state()
	x.mustApply(AddPartitions{Mirror: "m1", Topic: "orders", Partitions: 5, StartOffsets: []int64{0, 0}})
	after := x.state()
	before.Index = after.Index
	if !reflect.DeepEqual(before, after) {
		t.Fatal("a repeated AddPartitions changed the state")
	}
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping})
	x.mustFail(AddPartitions{Mirror: "m1", Topic: "orders", Partitions: 6, StartOffsets: []int64{0}}, ErrInvalid)
}

func TestApplySetTopicIDsFillsOnly(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicIDs{Mirror: "m1", Topic: "orders", SourceTopicID: "other", DestTopicID: "dst-1"})
	got := x.topic("m1", "orders")
	if got.SourceTopicID != "tid-1" || got.DestTopicID != "dst-1" {
		t.Fatalf("IDs = %q/%q: a known ID must never be replaced, an unknown one filled", got.SourceTopicID, got.DestTopicID)
	}
}

func TestApplyResumeAndRecordGap(t *testing.T) {
	x := newFixture(t)
	x.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring})
	x.mustFail(ResumePartition{Key: p1, AcceptGap: true}, ErrInvalid) // MIRRORING: nothing to resume
	x.mustApply(AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1", From: 0}}})
	x.mustApply(SetPartitionState{Key: p1, State: StateDiverged, Reason: "gap"})
	x.mustApply(ResumePartition{Key: p1, AcceptGap: true})
	p, _ := x.state().Partition(p1)
	if p.State != StateMirroring || p.Reason != "" || !p.AcceptGap || p.Generation != x.idx || p.Owner != "n1" {
		t.Fatalf("after resume: %+v", p)
	}
	lease := Lease{Owner: "n1", Generation: p.Generation}
	x.mustFail(RecordGap{Key: p1, Lease: Lease{Owner: "n1", Generation: 1}, From: 100, To: 150}, ErrStaleGeneration)
	x.mustApply(RecordGap{Key: p1, Lease: lease, From: 100, To: 150})
	p, _ = x.state().Partition(p1)
	if p.AcceptGap || p.SkippedRecords != 50 || p.LastGap != "100..149" {
		t.Fatalf("after the gap: %+v", p)
	}
	// The permission is used up: a second gap is refused.
	x.mustFail(RecordGap{Key: p1, Lease: lease, From: 200, To: 210}, ErrInvalid)
	// A start that finds no gap uses the permission up too.
	x.mustApply(SetPartitionState{Key: p1, State: StateFailed, Reason: "x"})
	x.mustApply(ResumePartition{Key: p1, AcceptGap: true})
	p, _ = x.state().Partition(p1)
	x.mustApply(RecordGap{Key: p1, Lease: Lease{Owner: "n1", Generation: p.Generation}, From: 300, To: 300})
	if p, _ = x.state().Partition(p1); p.AcceptGap || p.SkippedRecords != 50 {
		t.Fatalf("after an empty gap: %+v", p)
	}
	// The same gap accepted again (the partition restarted from a
	// checkpoint before it) is counted once.
	x.mustApply(SetPartitionState{Key: p1, State: StateDiverged, Reason: "gap"})
	x.mustApply(ResumePartition{Key: p1, AcceptGap: true})
	p, _ = x.state().Partition(p1)
	x.mustApply(RecordGap{Key: p1, Lease: Lease{Owner: "n1", Generation: p.Generation}, From: 100, To: 150})
	if p, _ = x.state().Partition(p1); p.SkippedRecords != 50 || p.LastGap != "100..149" {
		t.Fatalf("after the same gap again: %+v; want it counted once", p)
	}
}
