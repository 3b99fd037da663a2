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
	TypeAssign            CommandType = 6
	TypeSetProducer       CommandType = 7
	TypeRecordStopped     CommandType = 8
	TypeUpsertMember      CommandType = 9
	TypeRemoveMember      CommandType = 10
	TypeRemoveTopic       CommandType = 11
)

// IgnorableFlag marks a command type that a member which does not know it
// may skip. Set it only on commands whose loss cannot make members disagree
// about anything they do know (hints, caches); all others make an older
// member panic rather than silently diverge.
const IgnorableFlag CommandType = 0x80

// Ignorable reports whether t has the IgnorableFlag bit.
func (t CommandType) Ignorable() bool { return t&IgnorableFlag != 0 }

func (t CommandType) String() string {
	switch t {
	case TypeCreateMirror:
		return "CreateMirror"
	case TypeDeleteMirror:
		return "DeleteMirror"
	case TypeAddTopic:
		return "AddTopic"
	case TypeSetTopicState:
		return "SetTopicState"
	case TypeSetPartitionState:
		return "SetPartitionState"
	case TypeAssign:
		return "Assign"
	case TypeSetProducer:
		return "SetProducer"
	case TypeRecordStopped:
		return "RecordStopped"
	case TypeUpsertMember:
		return "UpsertMember"
	case TypeRemoveMember:
		return "RemoveMember"
	case TypeRemoveTopic:
		return "RemoveTopic"
	}
	return fmt.Sprintf("CommandType(%d)", uint8(t))
}

// payloadVersion is the second byte of every entry. Bump it when a payload
// changes meaning, and keep decoding the old versions.
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
// that is not DIVERGED. FAILED and DIVERGED set the topic only: they
// describe the topic as a whole and must not erase per-partition detail.
type SetTopicState struct {
	Mirror string     `json:"mirror"`
	Topic  string     `json:"topic"`
	State  TopicState `json:"state"`
	Reason string     `json:"reason,omitempty"`
	// DestTopicID is recorded when non-empty (known once PENDING ends).
	DestTopicID string `json:"dest_topic_id,omitempty"`
}

// SetPartitionState sets the state of one partition.
type SetPartitionState struct {
	Key    PartitionKey `json:"key"`
	State  TopicState   `json:"state"`
	Reason string       `json:"reason,omitempty"`
}

// Assign gives a partition to Owner ("" releases it) and starts a new
// generation, so the previous owner's writes become stale.
type Assign struct {
	Key   PartitionKey `json:"key"`
	Owner string       `json:"owner"`
}

// SetProducer records the producer identity of a partition. Generation is
// the writer's assignment generation; a stale one fails with
// ErrStaleGeneration.
type SetProducer struct {
	Key        PartitionKey     `json:"key"`
	Producer   ProducerIdentity `json:"producer"`
	Generation uint64           `json:"generation"`
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
type UpsertMember struct {
	Member Member `json:"member"`
}

// RemoveMember removes a member.
type RemoveMember struct {
	ID string `json:"id"`
}

// RemoveTopic removes a mirror topic.
type RemoveTopic struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
}

func (CreateMirror) Type() CommandType      { return TypeCreateMirror }
func (DeleteMirror) Type() CommandType      { return TypeDeleteMirror }
func (AddTopic) Type() CommandType          { return TypeAddTopic }
func (SetTopicState) Type() CommandType     { return TypeSetTopicState }
func (SetPartitionState) Type() CommandType { return TypeSetPartitionState }
func (Assign) Type() CommandType            { return TypeAssign }
func (SetProducer) Type() CommandType       { return TypeSetProducer }
func (RecordStopped) Type() CommandType     { return TypeRecordStopped }
func (UpsertMember) Type() CommandType      { return TypeUpsertMember }
func (RemoveMember) Type() CommandType      { return TypeRemoveMember }
func (RemoveTopic) Type() CommandType       { return TypeRemoveTopic }

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
	switch t {
	case TypeCreateMirror:
		return decodeAs[CreateMirror](t, v, payload)
	case TypeDeleteMirror:
		return decodeAs[DeleteMirror](t, v, payload)
	case TypeAddTopic:
		return decodeAs[AddTopic](t, v, payload)
	case TypeSetTopicState:
		return decodeAs[SetTopicState](t, v, payload)
	case TypeSetPartitionState:
		return decodeAs[SetPartitionState](t, v, payload)
	case TypeAssign:
		return decodeAs[Assign](t, v, payload)
	case TypeSetProducer:
		return decodeAs[SetProducer](t, v, payload)
	case TypeRecordStopped:
		return decodeAs[RecordStopped](t, v, payload)
	case TypeUpsertMember:
		return decodeAs[UpsertMember](t, v, payload)
	case TypeRemoveMember:
		return decodeAs[RemoveMember](t, v, payload)
	case TypeRemoveTopic:
		return decodeAs[RemoveTopic](t, v, payload)
	}
	return nil, fmt.Errorf("%w %d (ignorable: %t)", ErrUnknownCommand, uint8(t), t.Ignorable())
}

func decodeAs[T Command](t CommandType, version byte, payload []byte) (Command, error) {
	if version != payloadVersion {
		return nil, fmt.Errorf("%w: %s version %d, this build reads version %d", ErrUnknownVersion, t, version, payloadVersion)
	}
	var cmd T
	if err := json.Unmarshal(payload, &cmd); err != nil {
		return nil, fmt.Errorf("decode %s: %w", t, err)
	}
	return cmd, nil
}
