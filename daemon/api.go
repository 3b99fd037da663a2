package daemon

import (
	"context"
	"errors"
)

// Sentinel errors of the admin API. The HTTP layer maps them to status codes
// with errors.Is; every error carries a message that says what was wrong and
// what to do next.
var (
	ErrNotFound    = errors.New("not found")              // 404
	ErrExists      = errors.New("already exists")         // 409
	ErrInvalid     = errors.New("invalid request")        // 400
	ErrConflict    = errors.New("conflict")               // 409
	ErrNotLeader   = errors.New("not the raft leader")    // 503 (forwarded in later issues)
	ErrUnavailable = errors.New("dependency unavailable") // 502: source/destination unreachable
)

// CreateMirrorRequest defines a mirror: a named source cluster connection.
type CreateMirrorRequest struct {
	Name string `json:"name"`
	// Properties are Kafka-style source connection properties; must hold
	// bootstrap.servers.
	Properties map[string]string `json:"properties"`
}

// AddTopicsRequest starts mirroring topics of a mirror.
type AddTopicsRequest struct {
	Mirror string   `json:"mirror"`
	Topics []string `json:"topics"`
	// StartFrom is "earliest" (default) or "latest".
	StartFrom string `json:"start_from,omitempty"`
	// ReplicationFactor of the destination topic: 0 = the daemon's
	// destination.replication_factor, -1 = the destination broker's default.
	ReplicationFactor int16 `json:"replication_factor,omitempty"`
}

// MirrorSummary is one row of `kmirror list`.
type MirrorSummary struct {
	Name      string   `json:"name"`
	Topics    []string `json:"topics"`
	Bootstrap []string `json:"bootstrap"`
	// State summarises the topics: MIRRORING when all mirror, otherwise the
	// worst topic state (DIVERGED > FAILED > STOPPING > PENDING > PAUSED > STOPPED).
	State string `json:"state"`
}

// PartitionStatus is one row of `kmirror describe`.
type PartitionStatus struct {
	Mirror            string `json:"mirror"`
	Topic             string `json:"topic"`
	Partition         int32  `json:"partition"`
	SourceOffset      int64  `json:"source_offset"`      // source end offset (last stable offset)
	DestinationOffset int64  `json:"destination_offset"` // destination end offset
	Lag               int64  `json:"lag"`                // committed source records not yet mirrored
	State             string `json:"state"`
	Reason            string `json:"reason,omitempty"`
	Owner             string `json:"owner,omitempty"`
	// DuplicateRecords counts records of kmirror's own batches found twice
	// on the destination since the owner took the partition (a resend or
	// late request the broker could not de-duplicate; nothing is lost).
	DuplicateRecords int64 `json:"duplicate_records,omitempty"`
}

// Translation answers GET /v1/translate.
type Translation struct {
	Mirror            string `json:"mirror"`
	Topic             string `json:"topic"`
	Partition         int32  `json:"partition"`
	SourceOffset      int64  `json:"source_offset"`
	DestinationOffset int64  `json:"destination_offset"`
}

// API is what the HTTP layer serves. The member implements it.
type API interface {
	CreateMirror(ctx context.Context, req CreateMirrorRequest) error
	DeleteMirror(ctx context.Context, name string, force bool) error
	AddTopics(ctx context.Context, req AddTopicsRequest) error
	RemoveTopic(ctx context.Context, mirror, topic string) error
	ListMirrors(ctx context.Context) ([]MirrorSummary, error)
	Describe(ctx context.Context, mirror, topic string) ([]PartitionStatus, error)
	// Translate returns the destination offset at which a consumer that
	// stopped at sourceOffset on the source continues (design.md section 5).
	Translate(ctx context.Context, mirror, topic string, partition int32, sourceOffset int64) (Translation, error)
	// Ready returns nil when raft has a leader, the FSM has caught up and the
	// destination cluster answers; otherwise an error saying which is not.
	Ready(ctx context.Context) error
}
