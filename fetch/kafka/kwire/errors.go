package kwire

import (
	"fmt"

	kafka "github.com/segmentio/kafka-go"
)

// Action is what the data path does about a Kafka error code.
type Action int

const (
	// Retry the same request after a backoff; nothing else changes.
	Retry Action = 1
	// Refresh the partition's leader from fresh metadata, then retry.
	RefreshMetadata Action = 2
	// Fatal: the partition cannot continue without an operator or a
	// different decision (it goes FAILED or DIVERGED, with the reason).
	Fatal Action = 3
)

// Kafka error codes the data path handles by name.
const (
	CodeNone                    int16 = 0
	CodeOffsetOutOfRange        int16 = 1
	CodeCorruptMessage          int16 = 2
	CodeUnknownTopicOrPartition int16 = 3
	CodeLeaderNotAvailable      int16 = 5
	CodeNotLeaderOrFollower     int16 = 6
	CodeRequestTimedOut         int16 = 7
	CodeMessageTooLarge         int16 = 10
	CodeNetworkException        int16 = 13
	CodeCoordinatorLoading      int16 = 14
	CodeCoordinatorNotAvailable int16 = 15
	CodeNotCoordinator          int16 = 16
	CodeNotEnoughReplicas       int16 = 19
	CodeNotEnoughReplicasAfter  int16 = 20
	CodeInvalidTimestamp        int16 = 32
	CodeTopicAlreadyExists      int16 = 36
	CodeNotController           int16 = 41
	CodeDuplicateSequence       int16 = 46
	CodeOutOfOrderSequence      int16 = 45
	CodeInvalidProducerEpoch    int16 = 47
	CodeUnknownProducerID       int16 = 59
	CodeKafkaStorageError       int16 = 56
	CodeNonEmptyGroup           int16 = 68
	CodeGroupIDNotFound         int16 = 69
	CodeFencedLeaderEpoch       int16 = 74
	CodeUnknownLeaderEpoch      int16 = 75
	CodeOffsetNotAvailable      int16 = 78
	CodeThrottlingQuotaExceeded int16 = 89
	CodeProducerFenced          int16 = 90
)

// actions classifies the codes a Fetch or Produce partition response can
// carry. Anything not listed is Fatal: the partition stops with the broker's
// error named rather than looping on an error nobody planned for.
var actions = map[int16]Action{
	CodeRequestTimedOut:         Retry,
	CodeNetworkException:        Retry,
	CodeCoordinatorLoading:      Retry,
	CodeCoordinatorNotAvailable: Retry,
	CodeNotCoordinator:          Retry,
	CodeNotController:           Retry,
	CodeNotEnoughReplicas:       Retry,
	CodeNotEnoughReplicasAfter:  Retry,
	CodeKafkaStorageError:       RefreshMetadata,
	CodeThrottlingQuotaExceeded: Retry,
	CodeOffsetNotAvailable:      Retry,
	CodeUnknownTopicOrPartition: RefreshMetadata,
	CodeLeaderNotAvailable:      RefreshMetadata,
	CodeNotLeaderOrFollower:     RefreshMetadata,
	CodeFencedLeaderEpoch:       RefreshMetadata,
	CodeUnknownLeaderEpoch:      RefreshMetadata,
	CodeCorruptMessage:          Fatal,
	CodeMessageTooLarge:         Fatal,
	CodeInvalidTimestamp:        Fatal,
	CodeOutOfOrderSequence:      Fatal,
	CodeDuplicateSequence:       Fatal,
	CodeInvalidProducerEpoch:    Fatal,
	CodeUnknownProducerID:       Fatal,
	CodeProducerFenced:          Fatal,
	CodeOffsetOutOfRange:        Fatal,
}

// Classify returns what to do about a Kafka error code.
func Classify(code int16) Action {
	if a, ok := actions[code]; ok {
		return a
	}
	return Fatal
}

// Error is a Kafka error code returned for one partition.
type Error struct {
	Code      int16
	Topic     string
	Partition int32
	Op        string // "fetch", "produce", ...
	// Broker is the address of the broker that answered, when known.
	Broker string
}

func (e *Error) Error() string {
	at := ""
	if e.Broker != "" {
		at = " at kafka broker " + e.Broker
	}
	what := ""
	if e.Topic != "" {
		what = fmt.Sprintf(" %s/%d", e.Topic, e.Partition)
	}
	msg := fmt.Sprintf("%s%s%s: kafka error %d %s: %s", e.Op, at, what,
		e.Code, kafka.Error(e.Code).Title(), kafka.Error(e.Code).Description())
	if hint, ok := authorizationHints[e.Code]; ok {
		msg += ": " + hint
	}
	return msg
}

// Authorization error codes: the broker's authorizer refused the request.
const (
	CodeTopicAuthorizationFailed   int16 = 29
	CodeGroupAuthorizationFailed   int16 = 30
	CodeClusterAuthorizationFailed int16 = 31
)

// authorizationHints say what to fix for each authorization error.
var authorizationHints = map[int16]string{
	CodeTopicAuthorizationFailed: "the principal kmirror authenticates as has no ACL allowing this on the topic: " +
		"grant the ACLs the README lists (Least-privilege ACLs) on that cluster",
	CodeGroupAuthorizationFailed: "the principal kmirror authenticates as has no ACL allowing this on the consumer group: " +
		"grant the ACLs the README lists (Least-privilege ACLs) on that cluster",
	CodeClusterAuthorizationFailed: "the principal kmirror authenticates as has no ACL allowing this on the cluster: " +
		"grant the ACLs the README lists (Least-privilege ACLs) on that cluster",
}

// IsAuthorization reports whether code is an authorization failure.
func IsAuthorization(code int16) bool {
	_, ok := authorizationHints[code]
	return ok
}

// Action classifies the error.
func (e *Error) Action() Action { return Classify(e.Code) }
