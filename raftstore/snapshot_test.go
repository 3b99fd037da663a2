package raftstore

import (
	"bytes"
	"encoding/binary"
	"io"
	"reflect"
	"strings"
	"testing"
)

// memSink is a raft.SnapshotSink over a buffer.
type memSink struct {
	bytes.Buffer
	closed, cancelled bool
}

func (s *memSink) ID() string    { return "test" }
func (s *memSink) Close() error  { s.closed = true; return nil }
func (s *memSink) Cancel() error { s.cancelled = true; return nil }

func persist(t *testing.T, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	defer snap.Release()
	var sink memSink
	if err := snap.Persist(&sink); err != nil {
		t.Fatalf("persist: %v", err)
	}
	if !sink.closed || sink.cancelled {
		t.Fatalf("sink closed=%t cancelled=%t, want closed only", sink.closed, sink.cancelled)
	}
	return sink.Bytes()
}

func fsmWith(s *State) *FSM {
	f := NewFSM()
	f.state = s
	return f
}

func readState(f *FSM) *State {
	var s *State
	f.Read(func(st *State) { s = st.Clone() })
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	full := newFixture(t)
	full.mustApply(SetTopicState{Mirror: "m1", Topic: "orders", State: StateMirroring, Reason: "", DestTopicID: "dest-1"})
	full.mustApply(Assign{Key: p1, Owner: "n1"})
	full.mustApply(SetProducer{Key: p1, Producer: ProducerIdentity{ProducerID: 77, Epoch: 2}, Generation: full.idx})
	full.mustApply(RequestMove{Key: p1, Generation: full.idx - 1, To: "n1"})
	full.mustApply(ReleasePartition{Key: p1, Lease: Lease{Owner: "n1", Generation: full.idx - 2},
		Checkpoint: &Checkpoint{SourceOffset: 9, DestinationOffset: 7, Sequence: 4, Producer: ProducerIdentity{ProducerID: 77, Epoch: 2}}})
	full.mustApply(RecordStopped{Mirror: "m2", Topic: "orders", Positions: []Position{{SourceOffset: 8, DestinationOffset: 8, SourceLeaderEpoch: 4, SourceClusterID: "c", SourceTopicID: "t"}}})
	full.mustApply(UpsertMember{Member: Member{ID: "n2", RaftAddr: "h2:7000", Draining: true}})
	all := full.state()

	only := func(keep func(s *State)) *State {
		s := all.Clone()
		keep(s)
		return s
	}
	cases := map[string]*State{
		"empty": NewState(),
		"mirrors": only(func(s *State) {
			s.Topics, s.Members = map[string]*MirrorTopic{}, map[string]*Member{}
		}),
		"topics": only(func(s *State) {
			s.Mirrors, s.Members = map[string]*Mirror{}, map[string]*Member{}
		}),
		"members": only(func(s *State) {
			s.Mirrors, s.Topics = map[string]*Mirror{}, map[string]*MirrorTopic{}
		}),
		"all": all,
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			data := persist(t, fsmWith(want.Clone()))

			// Restore into an FSM that holds other state: it must be replaced.
			f := newFixture(t).f
			ch, cancel := f.Watch()
			defer cancel()
			if err := f.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
				t.Fatalf("restore: %v", err)
			}
			if got := readState(f); !reflect.DeepEqual(got, want) {
				t.Fatalf("restored state differs\n got: %+v\nwant: %+v", got, want)
			}
			select {
			case <-ch:
			default:
				t.Fatal("restore did not notify watchers")
			}
			// Persisting again gives the same bytes: records are in key order.
			if again := persist(t, f); !bytes.Equal(again, data) {
				t.Fatal("persist is not deterministic")
			}
		})
	}
}

func snapshotBytes(t *testing.T) []byte {
	t.Helper()
	return persist(t, newFixture(t).f)
}

// plainSnapshotBytes is the fixture in format 1 (records not compressed),
// which restore still reads, so tests can cut and patch its records.
func plainSnapshotBytes(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := writeSnapshotFormat(&buf, newFixture(t).state(), 1); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRestoreReadsFormat1(t *testing.T) {
	x := newFixture(t)
	s, err := readSnapshot(bytes.NewReader(plainSnapshotBytes(t)))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, x.state()) {
		t.Fatalf("format 1 restored %+v, want %+v", s, x.state())
	}
}

func TestRestoreRefuses(t *testing.T) {
	badVersion := snapshotBytes(t)
	binary.BigEndian.PutUint16(badVersion, 9)

	// Header, then a record of unknown type 9.
	unknownRecord := append(plainSnapshotBytes(t)[:10], 9, 0, 0, 0, 2, '{', '}', byte(recordEnd))

	good := plainSnapshotBytes(t)
	zipped := snapshotBytes(t)
	corrupt := append([]byte(nil), zipped...)
	corrupt[len(corrupt)-6] ^= 0xFF // inside the gzip CRC-32
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"bad version", badVersion, "snapshot format version 9 is not readable"},
		{"gzip checksum", corrupt, "checksum"},
		{"gzip cut", zipped[:len(zipped)-10], "unexpected EOF"},
		{"unknown record", unknownRecord, "unknown type 9"},
		{"no end marker", good[:len(good)-1], "no end marker"},
		{"cut record", good[:20], "unexpected EOF"},
		{"short header", good[:5], "read snapshot header"},
		{"huge length", append(append([]byte(nil), good[:10]...), byte(recordMirror), 0xFF, 0xFF, 0xFF, 0xFF), "over the"},
		{"bad JSON", append(append([]byte(nil), good[:10]...), byte(recordTopic), 0, 0, 0, 1, '{', byte(recordEnd)), "decode topic"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := newFixture(t)
			before := x.state()
			err := x.f.Restore(io.NopCloser(bytes.NewReader(c.data)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("restore error %v, want one containing %q", err, c.want)
			}
			if !reflect.DeepEqual(before, x.state()) {
				t.Fatal("failed restore changed the state")
			}
		})
	}
}

func TestRestoreRefusesDuplicates(t *testing.T) {
	var buf bytes.Buffer
	s := NewState()
	s.Members["n1"] = &Member{ID: "n1"}
	if err := writeSnapshotFormat(&buf, s, 1); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	rec := data[10 : len(data)-1] // the one member record
	dup := append(append(append([]byte(nil), data[:len(data)-1]...), rec...), byte(recordEnd))
	if _, err := readSnapshot(bytes.NewReader(dup)); err == nil || !strings.Contains(err.Error(), `member "n1" appears twice`) {
		t.Fatalf("duplicate member: %v", err)
	}
}
