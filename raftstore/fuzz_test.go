package raftstore

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// seedCommands is one command of every type, for the fuzz seed corpus.
func seedCommands() []Command {
	cp := Checkpoint{SourceOffset: 9, DestinationOffset: 7, Sequence: 4, Producer: ProducerIdentity{ProducerID: 77, Epoch: 2, Allocated: true}}
	return []Command{
		CreateMirror{Mirror: Mirror{Name: "m3", Bootstrap: []string{"a:1"}}},
		DeleteMirror{Name: "m2"},
		AddTopic{Topic: MirrorTopic{Mirror: "m1", Topic: "t", State: StatePending, Partitions: []PartitionInfo{{State: StatePending}}}},
		SetTopicState{Mirror: "m1", Topic: "orders", State: StateStopping},
		SetPartitionState{Key: p1, State: StateFailed, Reason: "x", Lease: Lease{Owner: "n1", Generation: 3}},
		Assign{Key: p1, Owner: "n1"},
		SetProducer{Key: p1, Producer: cp.Producer, Generation: 6},
		RecordStopped{Mirror: "m2", Topic: "orders", Positions: []Position{{SourceOffset: 1}}},
		UpsertMember{Member: Member{ID: "n2", Voter: true}},
		RemoveMember{ID: "n1"},
		RemoveTopic{Mirror: "m1", Topic: "orders"},
		AssignPartitions{Assignments: []Assignment{{Key: p1, Owner: "n1", Takeover: true}}},
		ReleasePartition{Key: p1, Lease: Lease{Owner: "n1", Generation: 6}, Checkpoint: &cp},
		RequestMove{Key: p1, Generation: 6, To: "n1"},
		PartitionStopped{Key: p1, Lease: Lease{Owner: "n1", Generation: 6}, Position: Position{SourceOffset: 3}, UnverifiedEnd: 5},
		SetDraining{ID: "n1", Draining: true},
		RenewProducer{Key: p1, Lease: Lease{Owner: "n1", Generation: 6}},
		AddPartitions{Mirror: "m1", Topic: "orders", Partitions: 4, StartOffsets: []int64{0, 0}},
		SetTopicIDs{Mirror: "m1", Topic: "orders", SourceTopicID: "AAAAAAAAAAAAAAAAAAAAAQ"},
		ResumePartition{Key: p1, AcceptGap: true},
		RecordGap{Key: p1, Lease: Lease{Owner: "n1", Generation: 6}, From: 100, To: 150},
		DeferredApplied{Mirror: "m1", Topic: "orders"},
		AlterMirror{Name: "m1", Bootstrap: []string{"a:9092"}, Properties: map[string]string{"groups.include": "g.*"}},
		SetWriteDenials{Topic: "t1", Principals: []string{"User:app"}},
		SettleStopped{Key: p1, Position: Position{SourceOffset: 9, DestinationOffset: 8}, Reason: "settled"},
		SetStopFence{Topic: "orders", Principal: "User:kmirror"},
		SetTopicPatterns{Name: "m1", Include: []string{"orders\\..*"}, Exclude: []string{".*-tmp"}},
		SetDiscoverySkips{Name: "m1", Skipped: map[string]string{"orders.x": "mirrored by mirror m2"}},
		SetConfigSyncError{Mirror: "m1", Topic: "orders", Error: "POLICY_VIOLATION"},
		SetMirrorNotes{Name: "m1", Notes: []string{"share groups are not carried"}},
		RecordHookAttempt{Mirror: "m1", ID: 7, Attempt: 1, AtMs: 1000, Error: "exit status 1"},
		SetGroupRestores{Mirror: "m1", Topic: "orders", Restores: []GroupRestore{{Group: "g", Partition: 0, DestinationCommitted: 1050, SourceOffset: 1000}}},
		ClearGroupRestores{Key: PartitionKey{Mirror: "m1", Topic: "orders"}, Lease: Lease{Owner: "n1", Generation: 3},
			Done: []GroupRestore{{Group: "g", DestinationCommitted: 1050, SourceOffset: 1000}}},
		SetSyncedACLs{Name: "m1", ACLs: []ACLBinding{{ResourceType: 2, Name: "orders", PatternType: 3, Principal: "User:a", Host: "*", Operation: 3, Permission: 3}}},
		RecordLateBatch{Key: p1, Batch: LateBatch{FirstOffset: 1106, LastOffset: 1205, ProducerID: 7, BaseSequence: 1006, Records: 100}},
	}
}

func TestSeedCommandsCoverEveryType(t *testing.T) {
	seen := map[CommandType]bool{}
	for _, c := range seedCommands() {
		seen[c.Type()] = true
	}
	for typ := range commands {
		if !seen[typ] {
			t.Errorf("seedCommands has no %s: add one so the fuzz corpus covers it", typ)
		}
	}
}

// FuzzDecodeApply feeds arbitrary log entries to the FSM: every entry
// either decodes and applies (or is refused) without a panic, or fails to
// decode with an error; a decoded command re-encodes to an entry that
// decodes the same way.
func FuzzDecodeApply(f *testing.F) {
	for _, c := range seedCommands() {
		b, err := Encode(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cmd, err := Decode(data)
		if err != nil {
			return
		}
		again, err := Encode(cmd)
		if err != nil {
			t.Fatalf("re-encode %s: %v", cmd.Type(), err)
		}
		if _, err := Decode(again); err != nil {
			t.Fatalf("decode of re-encoded %s: %v", cmd.Type(), err)
		}
		x := newFixture(t)
		x.idx++
		x.f.Apply(&raft.Log{Index: x.idx, Type: raft.LogCommand, Data: data})
		var buf bytes.Buffer
		if err := writeSnapshot(&buf, x.state()); err != nil {
			t.Fatalf("snapshot after %s: %v", cmd.Type(), err)
		}
	})
}

// FuzzRestore feeds arbitrary snapshots to readSnapshot: it returns a
// state or an error, never panics, and a state it returns snapshots and
// restores to the same bytes.
func FuzzRestore(f *testing.F) {
	x := newFixture(&testing.T{})
	for _, c := range seedCommands()[3:8] {
		_ = x.apply(c)
	}
	var buf bytes.Buffer
	if err := writeSnapshot(&buf, x.state()); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	var plain bytes.Buffer
	if err := writeSnapshotFormat(&plain, x.state(), 1); err != nil {
		f.Fatal(err)
	}
	f.Add(plain.Bytes())
	var empty bytes.Buffer
	if err := writeSnapshot(&empty, NewState()); err != nil {
		f.Fatal(err)
	}
	f.Add(empty.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := readSnapshot(bytes.NewReader(data))
		if err != nil {
			return
		}
		var a, b bytes.Buffer
		if err := writeSnapshot(&a, s); err != nil {
			t.Fatalf("snapshot of a restored state: %v", err)
		}
		s2, err := readSnapshot(bytes.NewReader(a.Bytes()))
		if err != nil {
			t.Fatalf("restore of a re-written snapshot: %v", err)
		}
		if err := writeSnapshot(&b, s2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.Bytes(), b.Bytes()) {
			t.Fatal("snapshot -> restore -> snapshot changed the bytes")
		}
	})
}

// TestWriteFuzzCorpus writes the seed corpus under testdata/fuzz when
// KMIRROR_WRITE_FUZZ_CORPUS=1, so it can be committed and grown by
// `go test -fuzz`.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("KMIRROR_WRITE_FUZZ_CORPUS") != "1" {
		t.Skip("set KMIRROR_WRITE_FUZZ_CORPUS=1 to rewrite testdata/fuzz")
	}
	write := func(target, name string, data []byte) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", data)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range seedCommands() {
		b, _ := Encode(c)
		write("FuzzDecodeApply", c.Type().String(), b)
	}
	x := newFixture(t)
	for _, c := range seedCommands()[3:8] {
		_ = x.apply(c)
	}
	var buf bytes.Buffer
	if err := writeSnapshot(&buf, x.state()); err != nil {
		t.Fatal(err)
	}
	write("FuzzRestore", "fixture", buf.Bytes())
	buf.Reset()
	if err := writeSnapshotFormat(&buf, x.state(), 1); err != nil {
		t.Fatal(err)
	}
	write("FuzzRestore", "fixture-format-1", buf.Bytes())
	bad := append([]byte{0, 9}, make([]byte, 8)...) // format version 9
	write("FuzzRestore", "unknown-version", append(bad, byte(recordEnd)))
}
