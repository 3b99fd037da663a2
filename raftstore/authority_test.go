package raftstore

import (
	"errors"
	"strings"
	"testing"
)

// TestAuthorityTable: every command type has its row; only the two kept
// for old logs have no submitter; a lease rule sits exactly on the
// commands that name a lease (register panics otherwise).
func TestAuthorityTable(t *testing.T) {
	for _, typ := range append(typesUpTo(TypeSettleStopped), TypeRecordLateBatch, TypeSetStopFence, TypeSetTopicPatterns, TypeSetDiscoverySkips, TypeSetConfigSyncError, TypeSetSyncedACLs) {
		e, ok := commands[typ]
		if !ok {
			t.Fatalf("command type %d has no row in the command table", typ)
		}
		if legacy := typ == TypeAssign || typ == TypeRecordStopped; (e.by == 0) != legacy {
			t.Errorf("%s: submitters %s", e.name, e.by)
		}
	}
}

// TestAuthorize: a member may submit its own partitions' reports (each
// naming its lease) and its own record, nothing an operator or the leader
// decides.
func TestAuthorize(t *testing.T) {
	k := PartitionKey{Mirror: "m", Topic: "t", Partition: 0}
	lease := Lease{Owner: "n2", Generation: 7}
	for _, cmd := range []Command{
		SetPartitionState{Key: k, State: StateFailed, Lease: lease},
		SetProducer{Key: k, Generation: 7, Owner: "n2"},
		RenewProducer{Key: k, Lease: lease},
		ReleasePartition{Key: k, Lease: lease},
		PartitionStopped{Key: k, Lease: lease},
		RecordGap{Key: k, Lease: lease, From: 1, To: 5},
		ClearGroupRestores{Key: k, Lease: lease},
		UpsertMember{Member: Member{ID: "n2"}},
		SetDraining{ID: "n2", Draining: true},
	} {
		if err := Authorize(cmd, ByMember); err != nil {
			t.Errorf("a member's %s: %v", cmd.Type(), err)
		}
	}
	for _, cmd := range []Command{
		CreateMirror{Mirror: Mirror{Name: "m"}},
		AssignPartitions{},
		RequestMove{Key: k},
		ResumePartition{Key: k, AcceptGap: true},
		RemoveMember{ID: "n3"},
		Assign{Key: k, Owner: "n2"},
		SettleStopped{Key: k},
		RecordLateBatch{Key: k},
		SetStopFence{Topic: "t", Principal: "User:kmirror"},
		SetTopicPatterns{Name: "m", Include: []string{".*"}},
		SetDiscoverySkips{Name: "m"},
		SetConfigSyncError{Mirror: "m", Topic: "t"},
		SetSyncedACLs{Name: "m"},
	} {
		err := Authorize(cmd, ByMember)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "a member may not submit "+cmd.Type().String()) {
			t.Errorf("a member's %s: %v, want refused", cmd.Type(), err)
		}
	}
	for _, cmd := range []Command{
		SetPartitionState{Key: k, State: StateFailed},
		SetProducer{Key: k, Generation: 7},
		RecordGap{Key: k, From: 1, To: 5},
	} {
		if err := Authorize(cmd, ByMember); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "must name its lease") {
			t.Errorf("a member's %s without a lease: %v, want refused", cmd.Type(), err)
		}
	}
	if err := Authorize(SetPartitionState{Key: k, State: StateDiverged}, ByLeader); err != nil {
		t.Errorf("the leader's own SetPartitionState: %v", err)
	}
	if err := Authorize(ResumePartition{Key: k}, ByOperator); err != nil {
		t.Errorf("an operator's ResumePartition: %v", err)
	}
}

// TestAuthorizeMemberSpeaksForItself: every command a member may submit
// names the member it speaks for, and a member may submit it only for
// itself (issue 18: a token holder rewrote the leader's address through
// another member's UpsertMember, and drained another member).
func TestAuthorizeMemberSpeaksForItself(t *testing.T) {
	k := PartitionKey{Mirror: "m", Topic: "t", Partition: 0}
	lease := Lease{Owner: "n2", Generation: 7}
	cmds := []Command{
		SetPartitionState{Key: k, State: StateFailed, Lease: lease},
		SetProducer{Key: k, Generation: 7, Owner: "n2"},
		RenewProducer{Key: k, Lease: lease},
		ReleasePartition{Key: k, Lease: lease},
		PartitionStopped{Key: k, Lease: lease},
		RecordGap{Key: k, Lease: lease, From: 1, To: 5},
		ClearGroupRestores{Key: k, Lease: lease},
		UpsertMember{Member: Member{ID: "n2", HTTPAddr: "10.0.0.2:8080"}},
		SetDraining{ID: "n2", Draining: true},
	}
	byMember := 0
	for _, e := range commands {
		if e.by&ByMember != 0 {
			byMember++
		}
	}
	if byMember != len(cmds) {
		t.Fatalf("the command table lets members submit %d commands, this test knows %d: add the new one here (and to SubjectOf)", byMember, len(cmds))
	}
	for _, cmd := range cmds {
		if err := AuthorizeMember(cmd, "n2"); err != nil {
			t.Errorf("n2's own %s: %v", cmd.Type(), err)
		}
		err := AuthorizeMember(cmd, "n3")
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `member "n3" may not submit `+cmd.Type().String()+` for member "n2"`) {
			t.Errorf("n3 submitting n2's %s: %v, want refused", cmd.Type(), err)
		}
		if err := AuthorizeMember(cmd, ""); !errors.Is(err, ErrInvalid) {
			t.Errorf("an unnamed caller's %s: %v, want refused", cmd.Type(), err)
		}
	}
	if err := AuthorizeMember(ResumePartition{Key: k}, "n2"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a member's ResumePartition: %v, want refused", err)
	}
}

func typesUpTo(last CommandType) []CommandType {
	var out []CommandType
	for typ := TypeCreateMirror; typ <= last; typ++ {
		out = append(out, typ)
	}
	return out
}
