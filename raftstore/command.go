package raftstore

import (
	"encoding/json"
	"errors"
	"fmt"
)

// CommandType is the first byte of every raft log entry. The numbers are
// stored on disk: never renumber or reuse one, only add.
type CommandType uint8

const (
	TypeCreateMirror      CommandType = 1
	TypeDeleteMirror      CommandType = 2
	TypeAddTopic          CommandType = 3
	TypeSetTopicState     CommandType = 4
	TypeSetPartitionState CommandType = 5
	// TypeAssign is the single, unconditional assignment of the first
	// single-member builds; kept so their logs replay. New code uses
	// TypeAssignPartitions.
	TypeAssign           CommandType = 6
	TypeSetProducer      CommandType = 7
	TypeRecordStopped    CommandType = 8
	TypeUpsertMember     CommandType = 9
	TypeRemoveMember     CommandType = 10
	TypeRemoveTopic      CommandType = 11
	TypeAssignPartitions CommandType = 12
	TypeReleasePartition CommandType = 13
	TypeRequestMove      CommandType = 14
	TypePartitionStopped CommandType = 15
	TypeSetDraining      CommandType = 16
	TypeRenewProducer    CommandType = 17
	TypeAddPartitions    CommandType = 18
	TypeSetTopicIDs      CommandType = 19
	TypeResumePartition  CommandType = 20
	TypeRecordGap        CommandType = 21
	TypeDeferredApplied  CommandType = 22
	TypeAlterMirror      CommandType = 23
	TypeSetWriteDenials  CommandType = 24
	TypeSettleStopped    CommandType = 25
	// TypeRecordLateBatch only names a batch on the partition (its
	// reason): a member that does not know it may skip it.
	TypeRecordLateBatch CommandType = 26 | IgnorableFlag
	// TypeSetStopFence records a fence only the leader acts on: an older
	// member that skips it, once leader, leaves the ACL to an add's
	// failure message (README, Security).
	TypeSetStopFence CommandType = 27 | IgnorableFlag
	// TypeSetTopicPatterns replaces a mirror's topic patterns.
	TypeSetTopicPatterns CommandType = 28
	// TypeSetDiscoverySkips only names the topics a discovery skipped (a
	// hint for describe): a member that does not know it may skip it.
	TypeSetDiscoverySkips CommandType = 29 | IgnorableFlag
	// TypeSetConfigSyncError only names a failed config sync (a hint for
	// describe): a member that does not know it may skip it.
	TypeSetConfigSyncError CommandType = 30 | IgnorableFlag
	// TypeSetSyncedACLs records the ACLs a mirror's ACL sync created: a
	// member that does not know ACL sync may skip it.
	TypeSetSyncedACLs CommandType = 31 | IgnorableFlag
	// TypeSetGroupRestores and TypeClearGroupRestores keep the group
	// positions a truncation took (State.GroupRestores): a member that
	// does not know them gives no position back, and disagrees on nothing
	// it knows.
	TypeSetGroupRestores   CommandType = 32 | IgnorableFlag
	TypeClearGroupRestores CommandType = 33 | IgnorableFlag
	// TypeSetMirrorNotes only names what the Kafka versions turn off (a
	// hint for list): a member that does not know it may skip it.
	TypeSetMirrorNotes CommandType = 34 | IgnorableFlag
	// TypeRecordHookAttempt records an attempt at a failover hook run
	// (Mirror.HookRuns): a member that does not know hooks may skip it.
	TypeRecordHookAttempt CommandType = 35 | IgnorableFlag
)

// IgnorableFlag marks a command type that a member which does not know it
// may skip. Set it only on commands whose loss cannot make members disagree
// about anything they do know (hints, caches); all others make an older
// member panic rather than silently diverge.
const IgnorableFlag CommandType = 0x80

// Ignorable reports whether t has the IgnorableFlag bit.
func (t CommandType) Ignorable() bool { return t&IgnorableFlag != 0 }

func (t CommandType) String() string {
	if c, ok := commands[t]; ok {
		return c.name
	}
	return fmt.Sprintf("CommandType(%d)", uint8(t))
}

// payloadVersion is the second byte of every entry. Bump it when a payload
// changes meaning, and keep decoding the old versions. Adding an optional
// field whose zero value keeps the old meaning is not a change of meaning.
const payloadVersion byte = 1

var (
	// ErrUnknownCommand is returned by Decode for a type byte this build
	// does not know.
	ErrUnknownCommand = errors.New("unknown command type")
	// ErrUnknownVersion is returned by Decode for a payload version this
	// build does not know.
	ErrUnknownVersion = errors.New("unknown command payload version")
)

// Command is one change to the replicated state.
type Command interface {
	Type() CommandType
}

// commandEntry is one row of the command table: how to decode a type, who
// may submit it (authority.go), and how to apply it at a raft index.
type commandEntry struct {
	name   string
	by     Submitter
	lease  LeaseRule
	decode func(version byte, payload []byte) (Command, error)
	apply  func(s *State, cmd Command, index uint64) error
}

// commands is the one table of command types (Consul's registerCommand
// shape): Decode, Apply and String all read it.
var commands = map[CommandType]commandEntry{}

// register adds command type T to the table: by and lease are its
// authority (Authorize; the lease is checked in Apply before apply runs).
// A duplicate type, or a lease rule on a command that names no lease, is a
// bug in this package and panics at start-up.
func register[T Command](name string, by Submitter, lease LeaseRule, apply func(s *State, c T, index uint64) error) {
	var zero T
	t := zero.Type()
	if _, dup := commands[t]; dup {
		panic(fmt.Sprintf("raftstore: command type %d registered twice", t))
	}
	if _, ok := Command(zero).(leased); ok != (lease != NoLease) {
		panic(fmt.Sprintf("raftstore: command %s: lease rule %d does not fit whether it names a lease", name, lease))
	}
	commands[t] = commandEntry{
		name:  name,
		by:    by,
		lease: lease,
		decode: func(version byte, payload []byte) (Command, error) {
			if version != payloadVersion {
				return nil, fmt.Errorf("%w: %s version %d, this build reads version %d", ErrUnknownVersion, name, version, payloadVersion)
			}
			var cmd T
			if err := json.Unmarshal(payload, &cmd); err != nil {
				return nil, fmt.Errorf("decode %s: %w", name, err)
			}
			return cmd, nil
		},
		apply: func(s *State, cmd Command, index uint64) error {
			if err := s.checkCommandLease(lease, cmd); err != nil {
				return err
			}
			return apply(s, cmd.(T), index)
		},
	}
}

func init() {
	const (
		leader   = ByLeader
		operator = ByOperator
		member   = ByMember
		nobody   = Submitter(0) // replayed from old logs only
	)
	register("CreateMirror", operator, NoLease, (*State).applyCreateMirror)
	register("DeleteMirror", operator, NoLease, (*State).applyDeleteMirror)
	register("AddTopic", operator, NoLease, (*State).applyAddTopic)
	register("SetTopicState", leader|operator, NoLease, (*State).applySetTopicState)
	register("SetPartitionState", leader|member, LeaseFromMember, (*State).applySetPartitionState)
	register("Assign", nobody, NoLease, (*State).applyAssign)
	register("SetProducer", member, LeaseGeneration, (*State).applySetProducer)
	register("RecordStopped", nobody, NoLease, (*State).applyRecordStopped)
	register("UpsertMember", leader|operator|member, NoLease, (*State).applyUpsertMember)
	register("RemoveMember", leader|operator, NoLease, (*State).applyRemoveMember)
	register("RemoveTopic", operator, NoLease, (*State).applyRemoveTopic)
	register("AssignPartitions", leader, NoLease, (*State).applyAssignPartitions)
	register("ReleasePartition", member, LeaseRequired, (*State).applyReleasePartition)
	register("RequestMove", leader, NoLease, (*State).applyRequestMove)
	register("PartitionStopped", member, LeaseRequired, (*State).applyPartitionStopped)
	register("SetDraining", operator|member, NoLease, (*State).applySetDraining)
	register("RenewProducer", member, LeaseRequired, (*State).applyRenewProducer)
	register("AddPartitions", leader, NoLease, (*State).applyAddPartitions)
	register("SetTopicIDs", leader, NoLease, (*State).applySetTopicIDs)
	register("ResumePartition", operator, NoLease, (*State).applyResumePartition)
	register("RecordGap", member, LeaseRequired, (*State).applyRecordGap)
	register("DeferredApplied", leader, NoLease, (*State).applyDeferredApplied)
	register("AlterMirror", operator, NoLease, (*State).applyAlterMirror)
	register("SetWriteDenials", leader|operator, NoLease, (*State).applySetWriteDenials)
	register("SettleStopped", leader, NoLease, (*State).applySettleStopped)
	register("RecordLateBatch", leader, NoLease, (*State).applyRecordLateBatch)
	register("SetStopFence", leader, NoLease, (*State).applySetStopFence)
	register("SetTopicPatterns", operator, NoLease, (*State).applySetTopicPatterns)
	register("SetDiscoverySkips", leader|operator, NoLease, (*State).applySetDiscoverySkips)
	register("SetConfigSyncError", leader|operator, NoLease, (*State).applySetConfigSyncError)
	register("SetSyncedACLs", leader|operator, NoLease, (*State).applySetSyncedACLs)
	register("SetGroupRestores", leader|operator, NoLease, (*State).applySetGroupRestores)
	register("SetMirrorNotes", leader|operator, NoLease, (*State).applySetMirrorNotes)
	register("ClearGroupRestores", member, LeaseRequired, (*State).applyClearGroupRestores)
	register("RecordHookAttempt", leader, NoLease, (*State).applyRecordHookAttempt)
}

// CreateMirror adds a mirror; it fails with ErrExists if the name is taken.
type CreateMirror struct {
	Mirror Mirror `json:"mirror"`
}

// DeleteMirror removes a mirror and all its topics.
type DeleteMirror struct {
	Name string `json:"name"`
}

// AddTopic adds a topic to an existing mirror. Topic.Partitions carries the
// resolved StartOffset of every partition.
type AddTopic struct {
	Topic MirrorTopic `json:"topic"`
}

// SetTopicState sets the state of a topic and of each of its partitions
// that is not DIVERGED or STOPPED. FAILED and DIVERGED set the topic only:
// they describe the topic as a whole and must not erase per-partition
// detail. STOPPING marks a remove in progress: every owner drains its
// partitions and records them stopped (PartitionStopped).
type SetTopicState struct {
	Mirror string     `json:"mirror"`
	Topic  string     `json:"topic"`
	State  TopicState `json:"state"`
	Reason string     `json:"reason,omitempty"`
	// DestTopicID is recorded when non-empty (known once PENDING ends).
	DestTopicID string `json:"dest_topic_id,omitempty"`
}

// Lease names the writer of a partition-scoped command: the member that
// owns the partition and the generation it was assigned in. A command
// whose lease is not the partition's current one fails with
// ErrStaleGeneration, so a member that lost the partition cannot change it.
type Lease struct {
	Owner      string `json:"owner,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
}

// SetPartitionState sets the state of one partition. With a Lease (a
// member's report) it applies only while that lease is current; without
// one it is the control plane's own decision.
type SetPartitionState struct {
	Key    PartitionKey `json:"key"`
	State  TopicState   `json:"state"`
	Reason string       `json:"reason,omitempty"`
	// GapBelow is set with DIVERGED for source records deleted before
	// they were mirrored: the source's log start then (PartitionInfo).
	GapBelow int64 `json:"gap_below,omitempty"`
	Lease
}

// Assign gives a partition to Owner ("" releases it) unconditionally.
// Only replayed from old logs; see AssignPartitions.
type Assign struct {
	Key   PartitionKey `json:"key"`
	Owner string       `json:"owner"`
}

// Assignment moves one partition from the lease the leader saw (From) to
// Owner ("" releases it).
type Assignment struct {
	Key   PartitionKey `json:"key"`
	Owner string       `json:"owner"`
	// From is the generation the leader decided on; a partition whose
	// generation moved since is left alone (the leader decides again).
	From uint64 `json:"from"`
	// Takeover says the previous owner did not hand the partition off (a
	// crash or an unreachable member): its handoff checkpoint, if any, no
	// longer holds, and the new owner resumes with the verified walk. The
	// producer identity is kept on purpose (fetch/DESIGN.md, fencing): a
	// late batch of the old owner is then byte-identical to the new
	// owner's and the broker de-duplicates it.
	Takeover bool `json:"takeover,omitempty"`
}

// AssignPartitions applies many assignments in one log entry. Each moved
// partition gets the entry's raft index as its generation, which never
// repeats, even across remove and re-add of a topic.
type AssignPartitions struct {
	Assignments []Assignment `json:"assignments"`
}

// SetProducer records the producer identity of a partition. Generation is
// the writer's assignment generation; a stale one fails with
// ErrStaleGeneration. Owner, when set, must be the current owner.
type SetProducer struct {
	Key        PartitionKey     `json:"key"`
	Producer   ProducerIdentity `json:"producer"`
	Generation uint64           `json:"generation"`
	Owner      string           `json:"owner,omitempty"`
}

// RenewProducer is asked by a partition's owner whose producer identity
// the destination refused (out-of-order sequence, unknown producer, a
// fenced epoch): the epoch is bumped and the partition gets a new
// generation, so the owner resumes with a walk under the new epoch.
type RenewProducer struct {
	Key PartitionKey `json:"key"`
	Lease
	Reason string `json:"reason,omitempty"`
}

// ReleasePartition is sent by an owner that drained a partition for a
// graceful handoff: Checkpoint is its exact final position, from which the
// next owner starts without a walk. The partition goes to the member it was
// being moved to (RequestMove), or is left unowned.
type ReleasePartition struct {
	Key PartitionKey `json:"key"`
	Lease
	// Checkpoint is nil when the drain was not clean: the next owner
	// then walks (the releasing owner has stopped writing, so nothing is
	// fenced).
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
}

// RequestMove asks the owner of a partition to hand it to another member:
// the owner drains it and sends ReleasePartition. To "" cancels the move.
type RequestMove struct {
	Key        PartitionKey `json:"key"`
	Generation uint64       `json:"generation"`
	To         string       `json:"to"`
}

// PartitionStopped records the last mirrored position of one partition of
// a STOPPING topic; once every partition is stopped the topic is STOPPED.
type PartitionStopped struct {
	Key PartitionKey `json:"key"`
	Lease
	Position Position `json:"position"`
	// Reason, when set, says what the recorded position leaves out (it
	// replaces the topic's reason on the partition).
	Reason string `json:"reason,omitempty"`
	// UnverifiedEnd, when set, is the destination offset (exclusive) up to
	// which records past Position could not be verified against the
	// source at the stop; they are settled once the source answers
	// (SettleStopped).
	UnverifiedEnd int64 `json:"unverified_end,omitempty"`
	// AtMs is when the owner stopped it (Unix ms; 0 from older builds):
	// the leader watches the partition for a late batch of kmirror's
	// after the stop for a while (PartitionInfo.StoppedAtMs).
	AtMs int64 `json:"at_ms,omitempty"`
}

// RecordLateBatch names a batch of kmirror's own producer that landed in
// a STOPPED partition after its recorded position: a member's produce
// request that the network held past its lease and delivered after the
// stop (issue 19). The leader submits it.
type RecordLateBatch struct {
	Key   PartitionKey `json:"key"`
	Batch LateBatch    `json:"batch"`
}

// SettleStopped records the last mirrored position of a STOPPED partition
// whose records past its recorded position could not be verified at the
// stop (PartitionInfo.UnverifiedEnd), once they were verified against the
// source: Position is where the verified records end, and Reason replaces
// the partition's (what is still left out, or why it stopped). The leader
// submits it (issue 18: unverified positions were never settled).
type SettleStopped struct {
	Key      PartitionKey `json:"key"`
	Position Position     `json:"position"`
	Reason   string       `json:"reason,omitempty"`
}

// RecordStopped records the final positions of a topic that stopped
// mirroring and marks it and its partitions STOPPED and unowned.
type RecordStopped struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
	// Positions is indexed by partition and covers every partition.
	Positions []Position `json:"positions"`
}

// UpsertMember adds a member or replaces the member with the same ID.
// With IfAbsent it only adds: an existing record (which may carry Joined
// or Draining) is left as it is.
type UpsertMember struct {
	Member   Member `json:"member"`
	IfAbsent bool   `json:"if_absent,omitempty"`
}

// RemoveMember removes a member.
type RemoveMember struct {
	ID string `json:"id"`
}

// SetDraining marks a member as draining (its partitions move away by
// handoff and it gets no new ones) or clears the mark.
type SetDraining struct {
	ID       string `json:"id"`
	Draining bool   `json:"draining"`
}

// AddPartitions grows a mirror topic to Partitions partitions after the
// source topic grew (the destination topic was grown first). StartOffsets
// holds the source offset each new partition starts from, in order. A
// topic that already has that many partitions is left as it is, so the
// leader may repeat the command after a crash.
type AddPartitions struct {
	Mirror       string  `json:"mirror"`
	Topic        string  `json:"topic"`
	Partitions   int     `json:"partitions"`
	StartOffsets []int64 `json:"start_offsets"`
}

// SetTopicIDs fills in the topic IDs (KIP-516) of a mirror topic where they
// are still unknown (topics added by builds that did not record them). A
// known ID is never replaced: a different ID means the topic was
// recreated, which is a divergence, not an update.
type SetTopicIDs struct {
	Mirror        string `json:"mirror"`
	Topic         string `json:"topic"`
	SourceTopicID string `json:"source_topic_id,omitempty"`
	DestTopicID   string `json:"dest_topic_id,omitempty"`
}

// ResumePartition is an operator's "go on" for a DIVERGED or FAILED
// partition: it becomes MIRRORING under a new generation, so its owner
// restarts it with the verified walk. AcceptGap allows that restart to
// skip source records deleted before they were mirrored, once (the owner
// records what it skipped with RecordGap).
type ResumePartition struct {
	Key       PartitionKey `json:"key"`
	AcceptGap bool         `json:"accept_gap,omitempty"`
	// AcceptGapBelow bounds the accepted gap: the source's log start
	// offset when the operator accepted it. A gap reaching past it
	// (records deleted since) is not accepted: DIVERGED again.
	AcceptGapBelow int64 `json:"accept_gap_below,omitempty"`
}

// RecordGap is sent by a partition's owner that skipped source offsets
// From..To-1 (deleted on the source before they were mirrored) under an
// operator's ResumePartition with AcceptGap: they are counted in
// SkippedRecords and the permission is used up.
type RecordGap struct {
	Key PartitionKey `json:"key"`
	Lease
	From int64 `json:"from"`
	To   int64 `json:"to"`
}

// DeferredApplied records that a topic's DeferredConfigs were set on the
// destination topic: they are cleared.
type DeferredApplied struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
}

// AlterMirror replaces a mirror's source bootstrap list and properties
// (kmirror alter); its name and source cluster ID stay.
type AlterMirror struct {
	Name       string            `json:"name"`
	Bootstrap  []string          `json:"bootstrap"`
	Properties map[string]string `json:"properties,omitempty"`
}

// SetTopicPatterns replaces mirror Name's topic patterns (Mirror.Include
// and Exclude; kmirror add --include, remove --include, alter). Patterns
// are checked by the API (they must compile); the state keeps them as
// given.
type SetTopicPatterns struct {
	Name    string   `json:"name"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// SetDiscoverySkips replaces mirror Name's Skipped topics (none clears).
type SetDiscoverySkips struct {
	Name    string            `json:"name"`
	Skipped map[string]string `json:"skipped,omitempty"`
}

// SetConfigSyncError records why the config sync of a mirror topic
// failed ("" clears it): MirrorTopic.ConfigSyncError.
type SetConfigSyncError struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
	Error  string `json:"error,omitempty"`
}

// SetSyncedACLs replaces mirror Name's SyncedACLs.
type SetSyncedACLs struct {
	Name string       `json:"name"`
	ACLs []ACLBinding `json:"acls,omitempty"`
}

// SetMirrorNotes replaces mirror Name's Notes (none clears).
type SetMirrorNotes struct {
	Name  string   `json:"name"`
	Notes []string `json:"notes,omitempty"`
}

// SetGroupRestores replaces the group positions kept for mirror topic
// Topic (State.GroupRestores); none removes them.
type SetGroupRestores struct {
	Mirror   string         `json:"mirror"`
	Topic    string         `json:"topic"`
	Restores []GroupRestore `json:"restores,omitempty"`
}

// ClearGroupRestores removes the kept positions of partition Key equal to
// Done (given back, or made moot by a later commit); an entry replaced
// meanwhile stays. Sent by the partition's owner under its lease: the
// member that commits them.
type ClearGroupRestores struct {
	Key   PartitionKey   `json:"key"`
	Lease Lease          `json:"lease"`
	Done  []GroupRestore `json:"done"`
}

// SetWriteDenials records the principals kmirror denies WRITE on a
// destination topic (State.WriteDenials); none removes the record.
type SetWriteDenials struct {
	Topic      string   `json:"topic"`
	Principals []string `json:"principals,omitempty"`
}

// SetStopFence records the DENY WRITE ACL for kmirror's own principal on a
// STOPPED destination topic (State.StopFences); an empty Principal
// removes the record.
type SetStopFence struct {
	Topic     string `json:"topic"`
	Principal string `json:"principal,omitempty"`
}

// RemoveTopic removes a mirror topic.
type RemoveTopic struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
}

func (CreateMirror) Type() CommandType       { return TypeCreateMirror }
func (DeleteMirror) Type() CommandType       { return TypeDeleteMirror }
func (AddTopic) Type() CommandType           { return TypeAddTopic }
func (SetTopicState) Type() CommandType      { return TypeSetTopicState }
func (SetPartitionState) Type() CommandType  { return TypeSetPartitionState }
func (Assign) Type() CommandType             { return TypeAssign }
func (AddPartitions) Type() CommandType      { return TypeAddPartitions }
func (SetTopicIDs) Type() CommandType        { return TypeSetTopicIDs }
func (ResumePartition) Type() CommandType    { return TypeResumePartition }
func (RecordGap) Type() CommandType          { return TypeRecordGap }
func (DeferredApplied) Type() CommandType    { return TypeDeferredApplied }
func (AlterMirror) Type() CommandType        { return TypeAlterMirror }
func (SetTopicPatterns) Type() CommandType   { return TypeSetTopicPatterns }
func (SetDiscoverySkips) Type() CommandType  { return TypeSetDiscoverySkips }
func (SetConfigSyncError) Type() CommandType { return TypeSetConfigSyncError }
func (SetSyncedACLs) Type() CommandType      { return TypeSetSyncedACLs }
func (SetWriteDenials) Type() CommandType    { return TypeSetWriteDenials }
func (SetGroupRestores) Type() CommandType   { return TypeSetGroupRestores }
func (SetMirrorNotes) Type() CommandType     { return TypeSetMirrorNotes }
func (ClearGroupRestores) Type() CommandType { return TypeClearGroupRestores }
func (SettleStopped) Type() CommandType      { return TypeSettleStopped }
func (RecordLateBatch) Type() CommandType    { return TypeRecordLateBatch }
func (SetStopFence) Type() CommandType       { return TypeSetStopFence }
func (SetProducer) Type() CommandType        { return TypeSetProducer }
func (RecordStopped) Type() CommandType      { return TypeRecordStopped }
func (UpsertMember) Type() CommandType       { return TypeUpsertMember }
func (RemoveMember) Type() CommandType       { return TypeRemoveMember }
func (RemoveTopic) Type() CommandType        { return TypeRemoveTopic }
func (AssignPartitions) Type() CommandType   { return TypeAssignPartitions }
func (ReleasePartition) Type() CommandType   { return TypeReleasePartition }
func (RequestMove) Type() CommandType        { return TypeRequestMove }
func (PartitionStopped) Type() CommandType   { return TypePartitionStopped }
func (SetDraining) Type() CommandType        { return TypeSetDraining }
func (RenewProducer) Type() CommandType      { return TypeRenewProducer }

// Encode returns the raft log bytes of cmd: type byte, payload version
// byte, JSON payload.
func Encode(cmd Command) ([]byte, error) {
	if cmd == nil {
		return nil, errors.New("encode command: nil command")
	}
	payload, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", cmd.Type(), err)
	}
	b := make([]byte, 0, 2+len(payload))
	b = append(b, byte(cmd.Type()), payloadVersion)
	return append(b, payload...), nil
}

// Decode parses bytes written by Encode. Unknown types fail with
// ErrUnknownCommand, unknown payload versions with ErrUnknownVersion.
// Commands are returned as values (CreateMirror, not *CreateMirror).
func Decode(b []byte) (Command, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("decode command: %d bytes is shorter than the 2-byte header", len(b))
	}
	t, v, payload := CommandType(b[0]), b[1], b[2:]
	c, ok := commands[t]
	if !ok {
		return nil, fmt.Errorf("%w %d (ignorable: %t)", ErrUnknownCommand, uint8(t), t.Ignorable())
	}
	return c.decode(v, payload)
}
