package api

import (
	"context"
	"time"

	"github.com/kmirror/kmirror/truncate"
)

// Server-side bounds a client waits for (beyond its own timeout).

// TruncateTimeout bounds a truncation: the quarantine copy of the
// divergent records and the topic's deletion.
const TruncateTimeout = 10 * time.Minute

// RemoveWait bounds how long remove waits for the owners to record the
// last mirrored positions.
const RemoveWait = 2 * time.Minute

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
	// DryRun returns the plan (PlanTopics) and changes nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Truncate lets a topic whose existing destination topic has records
	// past the last mirrored position be rebuilt: those records go to a
	// quarantine topic first (design.md section 8).
	Truncate bool `json:"truncate,omitempty"`
	// Include and Exclude are topic patterns (Go regular expressions
	// matched against whole topic names) saved on the mirror: the source
	// topics they match now are added, and the leader adds later ones
	// every topics.discovery.interval (issue 21). Internal topics (__*)
	// are never matched.
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Discovery marks the leader's own add of a topic its patterns
	// matched (never sent over the API): a failback is left to the
	// operator.
	Discovery bool `json:"-"`
}

// StateSkipped is the state describe shows for a topic a mirror's
// patterns match but did not add (its row's reason says why; partition
// -1).
const StateSkipped = "SKIPPED"

// PatternsRequest is the body of PUT /v1/mirrors/{name}/patterns: Include
// and Exclude replace the mirror's topic patterns (kmirror alter), or with
// Remove are taken out of them (kmirror remove --include/--exclude; the
// topics they added stay mirrored).
type PatternsRequest struct {
	Mirror  string   `json:"mirror,omitempty"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	Remove  bool     `json:"remove,omitempty"`
}

// AddResult answers an add: "added", and what --truncate did.
type AddResult struct {
	Status    string            `json:"status"`
	Truncated []truncate.Result `json:"truncated,omitempty"`
	// Topics is what became of each topic.
	Topics []AddedTopic `json:"topics,omitempty"`
	// Notes say what the operator may want to know (a pattern that
	// matches no topic yet).
	Notes []string `json:"notes,omitempty"`
}

// AddedTopic is one topic of an add.
type AddedTopic struct {
	Topic string `json:"topic"`
	// Result is TopicAdded, TopicPending or TopicNotAdded.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
}

// What became of a topic of an add.
const (
	TopicAdded = "added"
	// TopicPending: recorded, its destination topic not confirmed; the
	// leader finishes it (describe shows PENDING with the reason).
	TopicPending  = "pending"
	TopicNotAdded = "not added"
)

// AdminStepTimeout bounds each call to a Kafka cluster a member makes for
// an API request (daemon/ops).
const AdminStepTimeout = 15 * time.Second

// addStepsPerTopic is how many AdminStepTimeout-bounded steps an add runs
// one after the other for each topic: its check, lifting an earlier stop
// fence, clearing an earlier mirroring's checkpoints, creating (or
// continuing) it; one more for its raft writes.
const addStepsPerTopic = 5

// AddTimeout is how long a client waits for an add of n topics: the sum of
// the server's bounds of each topic's steps, and a minute for the rest
// (issue 18: an add of one topic could take 60 s while a client waited
// 30 s per topic).
func AddTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*addStepsPerTopic*AdminStepTimeout
}

// PlanResult answers an add with dry_run.
type PlanResult struct {
	Plans []truncate.Plan `json:"plans"`
}

// Failover hook run states (HookRunStatus.State).
const (
	HookPending   = "pending"   // no attempt yet (waiting for its topics to stop)
	HookRetrying  = "retrying"  // an attempt failed; another follows
	HookSucceeded = "succeeded" // an attempt succeeded
	HookFailed    = "failed"    // every attempt failed (failover.hook.retries)
)

// HookRunStatus is one failover's run of the mirror's failover hook
// (failover.hook.exec, failover.hook.url): ID is the event's (the
// webhook's Idempotency-Key), Kind remove, switchover, automatic or other;
// times are Unix ms.
type HookRunStatus struct {
	ID            string   `json:"id"`
	Topics        []string `json:"topics"`
	Kind          string   `json:"kind"`
	Reason        string   `json:"reason,omitempty"`
	State         string   `json:"state"`
	StoppedAtMs   int64    `json:"stopped_at_ms"`
	Attempts      int      `json:"attempts"`
	LastAttemptMs int64    `json:"last_attempt_ms,omitempty"`
	LastError     string   `json:"last_error,omitempty"`
	// Succeeded names, for a mirror with both hooks, the one that
	// succeeded while the other failed ("exec", "url"): it is not run
	// again.
	Succeeded []string `json:"succeeded,omitempty"`
}

// MirrorSummary is one row of `kmirror list`.
type MirrorSummary struct {
	Name      string   `json:"name"`
	Topics    []string `json:"topics"`
	Bootstrap []string `json:"bootstrap"`
	// Properties are the mirror's properties as given to create or alter,
	// with secrets shown as [hidden] (ksec.Redact): alter replaces them
	// all, so keep the file you gave (with its ${file:...} references).
	Properties map[string]string `json:"properties,omitempty"`
	// WriteDenied lists, per mirror topic, the principals kmirror denies
	// WRITE on the destination while the topic is mirrored (read-only
	// mirror topics, KIP-1279), as recorded in raft: the leader records a
	// DENY just before it creates it, and each broker enforces it once the
	// ACL change reached its metadata (KRaft: typically well under a second).
	WriteDenied map[string][]string `json:"write_denied,omitempty"`
	// Include and Exclude are the mirror's topic patterns; Skipped names
	// the topics they match that the last discovery did not add, with why.
	Include []string          `json:"include,omitempty"`
	Exclude []string          `json:"exclude,omitempty"`
	Skipped map[string]string `json:"skipped,omitempty"`
	// Notes name what the two clusters' Kafka versions turn off for the
	// mirror (found in the leader's config sync rounds).
	Notes []string `json:"notes,omitempty"`
	// State summarises the topics that are not STOPPED: MIRRORING when all
	// of them mirror, otherwise the worst (DIVERGED > FAILED > STOPPING >
	// PENDING > PAUSED); STOPPED when every topic is; EMPTY with none.
	State string `json:"state"`
	// FailoverHooks are the mirror's failover hook runs, oldest first:
	// those pending and the last finished ones.
	FailoverHooks []HookRunStatus `json:"failover_hooks,omitempty"`
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
	// ConvertedRecords counts records mirrored from legacy message sets
	// (message format v0/v1, Kafka before 0.11), converted to v2 batches
	// (Kafka 4.x refuses v0/v1: KIP-724) since the owner took the partition.
	ConvertedRecords int64 `json:"converted_records,omitempty"`
	// SkippedRecords counts source records deleted before they were
	// mirrored that an operator accepted to skip (kmirror resume
	// --accept-gap); LastGap is the latest such range of source offsets.
	SkippedRecords int64  `json:"skipped_records,omitempty"`
	LastGap        string `json:"last_gap,omitempty"`
	// StateSinceMs is since when the partition is in its raft state (Unix
	// ms; 0 unknown); Failures how often it went FAILED or DIVERGED since
	// it was added (describe --failed).
	StateSinceMs int64 `json:"state_since_ms,omitempty"`
	Failures     int   `json:"failures,omitempty"`
	// TimeLagMs is the replication latency in ms: how long the oldest
	// source record not yet on the destination has been on the source
	// (now minus its timestamp; with producer-set CreateTime an
	// estimate), 0 when caught up, -1 when not known (that record not
	// fetched yet).
	TimeLagMs int64 `json:"time_lag_ms"`
	// RecordsPerSec and BytesPerSec are what the owner mirrored over the
	// last minute (bytes of batches as written, compressed).
	RecordsPerSec float64 `json:"records_per_sec"`
	BytesPerSec   float64 `json:"bytes_per_sec"`
	// BytesLeft estimates the bytes of the Lag records not mirrored yet
	// (at the average batch bytes per record mirrored so far; -1 not
	// known); EtaSeconds is when, at RecordsPerSec, the partition catches
	// up with the source's end as it is now (0 caught up, -1 not known:
	// no rate yet).
	BytesLeft  int64 `json:"bytes_left"`
	EtaSeconds int64 `json:"eta_seconds"`
	// VerifiedUpTo is, with background verification on (the mirror's
	// verify.mode), the source offset below which the owner compared every
	// mirrored record in its current full pass (sampled: the highest
	// offset sampled, plus one); VerifiedRecords counts the records it
	// compared since it took the partition; VerifyMismatch is the
	// difference it found (the partition is DIVERGED with it);
	// VerifyNote names copies it found deleted on the destination
	// (retention or DeleteRecords there: not compared, no difference).
	// Omitted when nothing was verified.
	VerifiedUpTo    int64  `json:"verified_up_to,omitempty"`
	VerifiedRecords int64  `json:"verified_records,omitempty"`
	VerifyMismatch  string `json:"verify_mismatch,omitempty"`
	VerifyNote      string `json:"verify_note,omitempty"`
}

// VerifyRequest is the body of POST /v1/verify (kmirror verify).
type VerifyRequest struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
	// Full compares every mirrored record; otherwise Samples source
	// offsets per partition (default DefaultVerifySamples), the first and
	// the last mirrored one among them.
	Full    bool `json:"full,omitempty"`
	Samples int  `json:"samples,omitempty"`
}

// DefaultVerifySamples is VerifyRequest.Samples when not given.
const DefaultVerifySamples = 100

// VerifyTimeout bounds one kmirror verify (a full pass reads every
// mirrored record of the topic from both clusters).
const VerifyTimeout = 30 * time.Minute

// VerifyPartition is one partition's report of kmirror verify: the source
// offsets [From, To) it covered (To is the mirrored position), the record
// pairs found equal, and the first mismatch with its offsets (-1 for a
// side without a record). Skipped says why the partition was not
// compared (not MIRRORING, position or translation unknown).
type VerifyPartition struct {
	Partition           int32  `json:"partition"`
	From                int64  `json:"from"`
	To                  int64  `json:"to"`
	Compared            int64  `json:"compared"`
	Mismatch            string `json:"mismatch,omitempty"`
	MismatchSource      int64  `json:"mismatch_source"`
	MismatchDestination int64  `json:"mismatch_destination"`
	Skipped             string `json:"skipped,omitempty"`
}

// Translation answers GET /v1/translate.
type Translation struct {
	Mirror            string `json:"mirror"`
	Topic             string `json:"topic"`
	Partition         int32  `json:"partition"`
	SourceOffset      int64  `json:"source_offset"`
	DestinationOffset int64  `json:"destination_offset"`
}

// Service is what the admin API serves: the member implements it behind
// the HTTP server, and Client calls it over HTTP.
type Service interface {
	CreateMirror(ctx context.Context, req CreateMirrorRequest) error
	DeleteMirror(ctx context.Context, name string, force bool) error
	AddTopics(ctx context.Context, req AddTopicsRequest) (AddResult, error)
	RemoveTopic(ctx context.Context, mirror, topic string) error
	// SwitchoverTopic is a planned switchover: it keeps mirroring until
	// the topic has no lag against the source's last stable offset and
	// its groups are synced, then removes it as RemoveTopic does; it fails
	// (ErrConflict, the topic still MIRRORING) if that does not happen
	// within timeout. Notes name the groups that counted as synced because
	// the destination's commit is ahead of the source's (issue 18).
	SwitchoverTopic(ctx context.Context, mirror, topic string, timeout time.Duration) (notes []string, err error)
	ListMirrors(ctx context.Context) ([]MirrorSummary, error)
	Describe(ctx context.Context, mirror, topic string) ([]PartitionStatus, error)
	// Translate returns the destination offset at which a consumer that
	// stopped at sourceOffset on the source continues (design.md section 5).
	Translate(ctx context.Context, mirror, topic string, partition int32, sourceOffset int64) (Translation, error)
	// Verify compares the destination with the source record by record
	// for the offsets a topic's partitions have mirrored (issue 22): each
	// partition's report; a mismatch is a result, not an error.
	Verify(ctx context.Context, req VerifyRequest) ([]VerifyPartition, error)
	// Ready returns nil when raft has a leader, the FSM has caught up and the
	// destination cluster answers; otherwise an error saying which is not.
	Ready(ctx context.Context) error
	// Members lists the members of the group with their role, leased
	// partitions and liveness as the leader sees it.
	Members(ctx context.Context) ([]MemberStatus, error)
	// AddMember adds a member to the raft group (voter or not); start it
	// afterwards with the same peers list.
	AddMember(ctx context.Context, req AddMemberRequest) error
	// RemoveMember removes a member that holds no partitions (drain it
	// first) or that has been unreachable longer than the lease TTL.
	RemoveMember(ctx context.Context, id string) error
	// DrainMember moves every partition off a member by graceful handoff
	// and gives it no new ones (drain false ends that).
	DrainMember(ctx context.Context, id string, drain bool) error
	// ResumePartitions restarts DIVERGED or FAILED partitions of a topic
	// after an operator dealt with the cause; with AcceptGap a partition
	// may skip source records deleted before they were mirrored, counting
	// them. It returns the partitions resumed.
	ResumePartitions(ctx context.Context, req ResumeRequest) ([]int32, error)
	// PlanTopics is AddTopics' plan for each topic (add --dry-run): a new
	// topic, or one whose destination topic exists and continues from its
	// last mirrored position (with divergent records, if any).
	PlanTopics(ctx context.Context, req AddTopicsRequest) ([]truncate.Plan, error)
	// PauseTopics pauses a topic (every MIRRORING topic of the mirror for
	// topic ""): nothing is fetched, leases and positions stay.
	// UnpauseTopics resumes PAUSED topics exactly where they stopped. Both
	// return the topics they changed.
	PauseTopics(ctx context.Context, mirror, topic string) ([]string, error)
	UnpauseTopics(ctx context.Context, mirror, topic string) ([]string, error)
	// AlterMirror replaces a mirror's properties (kmirror alter); the
	// source must be the same cluster.
	AlterMirror(ctx context.Context, req CreateMirrorRequest) error
	// SetTopicPatterns replaces a mirror's topic patterns, or removes
	// some (PatternsRequest); new include patterns are matched at once.
	SetTopicPatterns(ctx context.Context, req PatternsRequest) (AddResult, error)
	// DescribeGroups shows the consumer group offset sync of every member,
	// optionally of one mirror.
	DescribeGroups(ctx context.Context, mirror string) ([]GroupStatus, error)
}

// ResumeRequest is the body of POST /v1/mirrors/{name}/topics/{topic}/resume.
type ResumeRequest struct {
	Mirror string `json:"mirror,omitempty"`
	Topic  string `json:"topic,omitempty"`
	// Partitions to resume; empty: every DIVERGED or FAILED partition.
	Partitions []int32 `json:"partitions,omitempty"`
	// AcceptGap lets each resumed partition skip, once, source records
	// deleted before they were mirrored (counted in skipped_records).
	AcceptGap bool `json:"accept_gap,omitempty"`
}

// ResumeResult answers a resume.
type ResumeResult struct {
	Resumed []int32 `json:"resumed"`
}

// PauseResult answers a pause or an unpause.
type PauseResult struct {
	Topics []string `json:"topics"`
}

// MemberStatus is one row of `kmirror members`.
type MemberStatus struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_address"`
	HTTPAddr string `json:"http_address"`
	// Role is leader, follower or non-voter.
	Role string `json:"role"`
	// Partitions counts the partitions leased to the member.
	Partitions int `json:"partitions"`
	// LastContactMs is how long ago the leader last heard from the member
	// (0 for the leader itself; -1: never, for a member added that has not
	// joined).
	LastContactMs int64 `json:"last_contact_ms"`
	// LeaseTTLMs is the lease_ttl the member announced, milliseconds (0:
	// not announced yet, or an older build); the leader takes its
	// partitions over after this or its own lease_ttl, the longer.
	LeaseTTLMs int64 `json:"lease_ttl_ms"`
	// LeaseGrantedMs is how long ago the leader last granted the member
	// its lease, milliseconds (-1: not in this leadership, or an older
	// build that renews by raft's heartbeats): its partitions move once
	// LeaseTTLMs has passed since (issue 19).
	LeaseGrantedMs int64 `json:"lease_granted_ms"`
	// State is alive, unreachable (not heard from within the lease TTL),
	// not started (added, never joined) or draining.
	State string `json:"state"`
	// Error, while the leader's heartbeats to the member fail, is why its
	// last raft connection failed (refused, timed out, a TLS error), when
	// that is known.
	Error string `json:"error,omitempty"`
}

// AddMemberRequest adds a member to the group.
type AddMemberRequest struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_address"`
	HTTPAddr string `json:"http_address"`
	NonVoter bool   `json:"non_voter,omitempty"`
}

// LiveStatus is one partition a member runs, as GET /v1/internal/status
// reports it for describe on any member.
type LiveStatus struct {
	Mirror            string `json:"mirror"`
	Topic             string `json:"topic"`
	Partition         int32  `json:"partition"`
	State             string `json:"state"`
	Retrying          string `json:"retrying,omitempty"`
	SourceEnd         int64  `json:"source_end"`
	SourcePosition    int64  `json:"source_position"` // next source offset to mirror
	DestinationOffset int64  `json:"destination_offset"`
	Lag               int64  `json:"lag"`
	DuplicateRecords  int64  `json:"duplicate_records,omitempty"`
	Duplicate         string `json:"duplicate,omitempty"`
	ConvertedRecords  int64  `json:"converted_records,omitempty"`
	// MirroredRecords, MirroredBytes, RecordsPerSec, BytesPerSec and
	// TimeLagMs are fetch.Status's; TimeLagMs is nil from a member that
	// does not report it (an older version during an upgrade).
	MirroredRecords int64   `json:"mirrored_records,omitempty"`
	MirroredBytes   int64   `json:"mirrored_bytes,omitempty"`
	RecordsPerSec   float64 `json:"records_per_sec,omitempty"`
	BytesPerSec     float64 `json:"bytes_per_sec,omitempty"`
	TimeLagMs       *int64  `json:"time_lag_ms,omitempty"`
	// VerifiedUpTo, VerifiedRecords and VerifyMismatch are the owner's
	// background verification (verify.mode): see PartitionStatus.
	VerifiedUpTo    int64  `json:"verified_up_to,omitempty"`
	VerifiedRecords int64  `json:"verified_records,omitempty"`
	VerifyMismatch  string `json:"verify_mismatch,omitempty"`
	VerifyNote      string `json:"verify_note,omitempty"`
	Waiting         string `json:"waiting,omitempty"`
	Throttled       string `json:"throttled,omitempty"`
	// SourceAgeMs is how long ago, in ms, the partition's source leader
	// last answered the owner's fetch (-1: never): SourceEnd and Lag are
	// as of then. FetchWaitMs is how long, in ms, a fetch for it has
	// waited unanswered (0: none waits); ProduceWaitMs the same for the
	// produce in flight.
	SourceAgeMs   int64 `json:"source_age_ms"`
	FetchWaitMs   int64 `json:"fetch_wait_ms,omitempty"`
	ProduceWaitMs int64 `json:"produce_wait_ms,omitempty"`
}

// InternalApplyRequest carries one encoded raft command from a member to the
// leader (POST /v1/internal/apply).
type InternalApplyRequest struct {
	Entry []byte `json:"entry"`
}

// Group sync states shown by describe --groups.
const (
	GroupSynced   = "synced"   // the destination holds the translated source commit
	GroupPending  = "pending"  // not synced yet: the reason says what it waits for
	GroupConflict = "conflict" // left alone: the reason says why and what to do
)

// GroupStatus is one row of describe --groups: one group's committed
// offset of one mirrored partition on both clusters.
type GroupStatus struct {
	Mirror    string `json:"mirror"`
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// SourceCommitted and DestinationCommitted are the committed offsets
	// (the next offset the group reads); -1 when the destination has none.
	SourceCommitted      int64  `json:"source_committed"`
	DestinationCommitted int64  `json:"destination_committed"`
	State                string `json:"state"`
	Reason               string `json:"reason,omitempty"`
	// SyncLagMs is how long the source's current commit has waited
	// without reaching the destination (0 when synced), in ms.
	SyncLagMs int64 `json:"sync_lag_ms"`
	// Member is the kmirror member that syncs the partition.
	Member string `json:"member"`
	// SyncedAtMs is when the sync round that produced the row started
	// (Unix ms): a planned switchover waits for a round that began after
	// the topic caught up.
	SyncedAtMs int64 `json:"synced_at_ms"`
	// Ahead marks a conflict in which the destination's commit is ahead
	// of the source's translated one: kmirror leaves it, and a planned
	// switchover counts it done (nothing would be read twice or lost).
	Ahead bool `json:"ahead,omitempty"`
	// Restore marks a row that gives back a destination group's position
	// which add --truncate took with the deleted topic (issue 21, section
	// 4): SourceCommitted is that position in the source's offsets, not a
	// source group's commit. It goes once committed.
	Restore bool `json:"restore,omitempty"`
	// Kind is "share" for a share group (KIP-932: SourceCommitted and
	// DestinationCommitted are share-partition start offsets), "" for a
	// consumer group.
	Kind string `json:"kind,omitempty"`
	// Unsupported marks a group kmirror cannot carry to this destination
	// (a share group into a cluster without share groups): the reason
	// says so, and a switchover does not wait for it.
	Unsupported bool `json:"unsupported,omitempty"`
}

// Reach is one member's view of the clusters it works with
// (GET /v1/internal/reach): the raft leader reads it each second for
// automatic failover and placement.
type Reach struct {
	Sources     []SourceReach    `json:"sources"`
	Destination DestinationReach `json:"destination"`
}

// DestinationReach is one member's view of the destination cluster.
type DestinationReach struct {
	// UnreachableMs is how long, in ms, the destination has not answered
	// this member (0 while it answers): the longer of its metadata probe's
	// failures and the oldest produce of its partitions left unanswered
	// (written, then timed out). Error says which.
	UnreachableMs int64  `json:"unreachable_ms"`
	Error         string `json:"error,omitempty"`
}

// SourceReach is one member's view of a mirror's source cluster.
type SourceReach struct {
	Mirror string `json:"mirror"`
	// UnreachableMs is how long the source has not answered (0 while it
	// answers), in ms; Error is the last failure.
	UnreachableMs int64  `json:"unreachable_ms"`
	Error         string `json:"error,omitempty"`
}

// LagSample is one point of the status page's lag charts (GET /ui): when
// (Unix ms) and, per topic ("mirror/topic"), the source records not yet
// mirrored (the sum over its partitions whose lag is known) and the
// largest time lag (ms).
type LagSample struct {
	AtMs   int64               `json:"at_ms"`
	Topics map[string]TopicLag `json:"topics"`
}

// TopicLag is one topic's lag in a LagSample.
type TopicLag struct {
	Records   int64 `json:"records"`
	TimeLagMs int64 `json:"time_lag_ms"`
}

// LagHistorian is a Service that keeps the last hour of lag samples for
// the status page (an in-memory ring on each member).
type LagHistorian interface {
	LagHistory() []LagSample
}
