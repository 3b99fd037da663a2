package fetch

import (
	"context"
	"fmt"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// Key names one mirrored partition.
type Key struct {
	Mirror    string
	Topic     string
	Partition int32
}

func (k Key) String() string { return fmt.Sprintf("%s:%s/%d", k.Mirror, k.Topic, k.Partition) }

// Less orders keys by mirror, topic, then partition.
func (k Key) Less(o Key) bool {
	if k.Mirror != o.Mirror {
		return k.Mirror < o.Mirror
	}
	if k.Topic != o.Topic {
		return k.Topic < o.Topic
	}
	return k.Partition < o.Partition
}

// Spec is a partition lease handed to the engine by the control plane.
type Spec struct {
	Key        Key
	Generation uint64
	Producer   *kafka.ProducerID // nil: allocate one
	// StartOffset is where mirroring starts when no checkpoint exists.
	StartOffset int64
	// Handoff is the exact position the previous owner released the
	// partition at after draining it (a graceful handoff): the engine
	// continues there without a walk. nil: resume with the verified walk.
	Handoff *Handoff
	// SourceTopicID and DestTopicID are the topic IDs (KIP-516) the mirror
	// recorded; a topic found under another ID was deleted and recreated,
	// and the partition stops DIVERGED instead of mirroring other records.
	// "" skips the check (not recorded yet, or a broker before Kafka 2.8).
	SourceTopicID, DestTopicID string
	// Diverged is set when the control plane holds the partition DIVERGED
	// (its reason): the engine stops it, or holds it stopped with its last
	// checkpointed position so describe still shows where it stands.
	Diverged string
	// AcceptGap lets this start skip source records deleted before they
	// were mirrored (kmirror resume --accept-gap): the skipped range is
	// recorded through Control.RecordGap before mirroring goes on.
	AcceptGap bool
	// AcceptGapBelow bounds it: a gap reaching this source offset or
	// beyond (records deleted after the operator accepted) is DIVERGED
	// again. 0: no bound.
	AcceptGapBelow int64
	// Fences is how many times the owner had lost its lease (been fenced)
	// when it read the state this spec comes from. A held partition whose
	// generation changed across a fence may have had another owner
	// meanwhile, writing under the same producer identity (a takeover
	// keeps it, DESIGN.md section 3): the engine resumes it with the walk
	// instead of trusting its in-memory position. A generation that
	// changed with no fence between (a producer renewal, a rebalance that
	// kept the partition here) is taken over in place.
	Fences uint64
}

// Handoff is a partition's exact position after a clean drain: every
// fetched batch produced and acknowledged, the checkpoint written.
type Handoff struct {
	Position Position
	// Sequence is the next sequence number of Producer.
	Sequence int32
	Producer kafka.ProducerID
}

// Source is how to reach a mirror's source cluster.
type Source struct {
	Bootstrap []string
	Security  kafka.Security
	// SecurityKey changes when the security settings do (not when a file
	// they name changes: files are read at every dial); a new key makes
	// the engine drop the source's connections and dial anew.
	SecurityKey string
	// ClientID is the Kafka client.id on the source ("": Config.ClientID).
	ClientID string
	// FetchConnections is how many fetch connections (sessions, each over
	// its own share of the partitions) the engine keeps to each source
	// broker; 0 sizes it from the round trip the kernel measured on the
	// first one (fetchConnsFor). Changing it needs no new source.
	FetchConnections int
}

// State of a partition as the engine reports it.
type State string

const (
	Starting  State = "STARTING"  // resuming: walking source and destination
	Mirroring State = "MIRRORING" // copying
	Draining  State = "DRAINING"  // finishing in-flight work before a stop
	Stopped   State = "STOPPED"   // released
	Failed    State = "FAILED"    // retrying with backoff
	Diverged  State = "DIVERGED"  // source and destination disagree: needs an operator
)

// Control is what the engine needs from the control plane.
type Control interface {
	// SaveProducer durably records a newly allocated producer identity for
	// the partition at the given lease generation. It must fail if the
	// generation is no longer current (the lease moved).
	SaveProducer(ctx context.Context, key Key, generation uint64, id kafka.ProducerID) error
	// Report tells the control plane about a state change with its reason.
	// gapBelow is set (> 0) for a partition DIVERGED because source
	// records were deleted before they were mirrored: the source's log
	// start it saw, the end of the gap an operator may accept.
	// generation is the lease generation the change was observed under:
	// the report is refused if the partition moved on since (issue 19).
	Report(key Key, generation uint64, state State, reason string, gapBelow int64)
	// RenewProducer asks the control plane for a new producer epoch after
	// the destination refused the partition's identity (out-of-order
	// sequence, unknown producer, fenced epoch). The partition waits,
	// FAILED, until Assign hands it a new generation.
	RenewProducer(key Key, generation uint64, reason string)
	// RecordGap durably records that the partition skipped source offsets
	// from..to-1 (to == from: none) under the operator's AcceptGap
	// permission, which it uses up. The partition does not mirror past
	// the gap before this succeeds.
	RecordGap(ctx context.Context, key Key, generation uint64, from, to int64) error
	// WriteDeadline is when this member's lease ends: it sends no produce
	// request after it, and a request must be wholly written before it
	// (design.md section 3, self-fencing).
	WriteDeadline() time.Time
	// WriteDeadlineAhead is when a produce request with ahead of answer
	// time owed before it on its connection must be wholly written: ahead
	// before the lease's end, and never after WriteDeadline (which may be
	// earlier than the lease's end for reasons ahead does not move, such
	// as a member's own lease check). The produce window's lease rule
	// (fetch/DESIGN.md, "The produce window").
	WriteDeadlineAhead(ahead time.Duration) time.Time
	// LeaseLosses counts the times this member's lease was lost (it was
	// fenced). A deadline read after a count that has not moved since
	// comes from the same unbroken lease: a renewal, not a lease that
	// lapsed and was granted again.
	LeaseLosses() uint64
}

// Position is where a partition's mirroring stands.
type Position struct {
	SourceOffset      int64 // next source offset to mirror
	DestinationOffset int64 // next destination offset
	SourceLeaderEpoch int32 // leader epoch of the last mirrored batch
}

// Status is a partition's progress for describe.
type Status struct {
	Key   Key
	State State
	// Reason is set for FAILED and DIVERGED.
	Reason string
	// Retrying names the retriable error a MIRRORING partition is waiting
	// out (a destination without enough in-sync replicas, a moving leader).
	Retrying string
	Position Position
	// SourceEnd is the source's last stable offset at the last fetch.
	SourceEnd int64
	// Lag is SourceEnd - Position.SourceOffset (committed offsets not yet
	// mirrored).
	Lag int64
	// DuplicateRecords counts records of kmirror's own batches that landed
	// twice on the destination (a resend or a late request the broker could
	// not de-duplicate) since this member took the partition; Duplicate
	// describes the latest, with its destination offsets.
	DuplicateRecords int64
	Duplicate        string
	// ConvertedRecords counts records mirrored from legacy message sets
	// (message format v0/v1, Kafka before 0.11), converted to v2 batches
	// because Kafka 4.x brokers refuse v0/v1 (KIP-724), since this member
	// took the partition.
	ConvertedRecords int64
	// MirroredRecords and MirroredBytes count the records and batch bytes
	// (as written to the destination, compressed) the destination
	// acknowledged since this member took the partition; RecordsPerSec
	// and BytesPerSec are their rates over the last minute. TimeLagMs is
	// the replication latency in ms: how long the oldest source record not
	// yet on the destination has been on the source, 0 caught up, -1 not
	// known (see timeLagMs).
	MirroredRecords, MirroredBytes int64
	RecordsPerSec, BytesPerSec     float64
	TimeLagMs                      int64
	// TranslationEntries and TranslationBytes are the breakpoints the
	// partition's translation holds in memory and about how many bytes
	// they take (bounded by the source's retention, see Translation.Trim,
	// and by translation_max_bytes, see Translation.SetLimit);
	// TranslationFloor is the source offset from which offsets translate
	// (0: every offset since the start).
	TranslationEntries int
	TranslationBytes   int64
	TranslationFloor   int64
	// CheckpointFailing is set while the partition's checkpoint cannot be
	// written to the offsets topic (Retrying says why).
	CheckpointFailing bool
	// Waiting says why a caught-up partition's lag does not count records
	// the source holds: an open transaction keeps the last stable offset
	// (what read_committed mirrors up to) below the high watermark.
	Waiting string
	// Throttled says how long the destination broker last throttled this
	// partition's produce (a client quota, KIP-219); "" when it did not.
	Throttled string
	// SourceAnswered is when the partition's source leader last answered
	// a fetch for it (zero: not yet): SourceEnd is as of then. SourceAsked
	// is when a fetch for it was sent that is still unanswered (zero:
	// none). SentAt is when the produce in flight was sent (zero: none in
	// flight).
	SourceAnswered, SourceAsked time.Time
	SentAt                      time.Time
	// DestinationUnanswered is when a produce of the partition was sent
	// that the destination never answered, with none answered since (zero:
	// the destination answers).
	DestinationUnanswered time.Time
}

// DefaultTranslationMaxBytes is the default bound on one partition's
// translation breakpoints (16 MiB: about 4 million breakpoints, some five
// days of a transactional topic committing ten times a second, whose every
// commit marker breaks the mapping).
const DefaultTranslationMaxBytes = 16 << 20

// Config configures the engine.
type Config struct {
	ClientID            string
	Destination         []string // destination bootstrap servers
	DestinationSecurity kafka.Security
	MemoryBudget        int64 // bytes of fetched data held at once (record sets at their pooled size, recordBuf)
	// TranslationMaxBytes bounds each held partition's translation
	// breakpoints in memory, bytes (Translation.SetLimit); 0:
	// DefaultTranslationMaxBytes.
	TranslationMaxBytes int64
	Checkpoint          time.Duration
	// FetchMaxWait is the longest wait a fetch asks of the source broker
	// while records flow (a fetch loop's partitions are caught up but not
	// idle). A broker answers as soon as records arrive, but a partition
	// routed to the loop during a wait (a new topic, a resumed partition,
	// a leader move) is first fetched only after it: at 500 ms (Kafka's
	// fetch.max.wait.ms) the first second of a new topic's records came
	// through kmirror about 90 ms later at the median than read from the
	// source (bench latency run, issue 20). Default 100 ms.
	FetchMaxWait time.Duration
	// IdleFetchMaxWait is the longest wait a fetch asks of the source
	// broker while its session is idle (no records in the last answers,
	// nothing queued): the wait doubles from FetchMaxWait up to it. A
	// broker answers a waiting fetch as soon as records arrive, so it
	// costs no latency; it cuts how often the broker reads every partition
	// of an idle session (issue 20: 10,000 idle partitions took 10-18% of
	// a source broker's core at 500 ms, under 1% at 5 s). Default 5 s.
	IdleFetchMaxWait time.Duration
	FetchMaxBytes    int32
	PartitionBytes   int32 // per-partition fetch size
	ProduceTimeout   time.Duration
	// ProduceWindow is how many produce requests may await their answers
	// on one destination connection, and so how many batches of one
	// partition may be in flight (1..MaxProduceWindow; 0: the maximum).
	// 1 sends a partition's next batch only once the last is answered.
	ProduceWindow   int
	OffsetsTopic    string // internal topic: checkpoints and translation log
	StateTopic      string // internal topic: last mirrored positions
	InternalRF      int16  // replication factor of internal topics (-1: broker default)
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// ProduceObserver, when set, is told of every batch this engine sent
	// in a produce request the broker may have received, once the request
	// ended (answered, failed or timed out). It runs on the produce loop:
	// keep it short. The in-process tier records the history of writes
	// with it (issue 19); nil in a member.
	ProduceObserver func(ProduceEvent)
}

// MaxProduceWindow is the most produce requests kmirror keeps awaiting
// answers on one destination connection: an idempotent producer's limit
// (max.in.flight.requests.per.connection 5), as a broker keeps the
// metadata of a producer's last 5 batches per partition to de-duplicate a
// resend (ProducerStateManager, KIP-98), and a partition has at most one
// batch in each request.
const MaxProduceWindow = 5

// ProduceEvent is one batch of one produce request (Config.ProduceObserver).
type ProduceEvent struct {
	Key Key
	// Generation is the partition's lease generation the batch was sent
	// under.
	Generation uint64
	// ProducerID, ProducerEpoch and BaseSequence are the batch's producer
	// identity and first sequence number; Records its record count.
	ProducerID    int64
	ProducerEpoch int16
	BaseSequence  int32
	Records       int32
	// SentAt is when the request began to be written; WriteBy the end of
	// this member's lease it had to be written by.
	SentAt, WriteBy time.Time
	// EndedAt is when the request ended: its answer arrived (Answered),
	// or it failed or timed out and its connection was reset, so nothing
	// more of it is sent. BaseOffset is where the batch was appended (-1
	// unless answered without error); ErrorCode the partition's Kafka
	// error.
	EndedAt    time.Time
	Answered   bool
	BaseOffset int64
	ErrorCode  int16
}

// Defaults fills zero fields.
func (c *Config) Defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.MemoryBudget == 0 {
		c.MemoryBudget = 256 << 20
	}
	if c.TranslationMaxBytes == 0 {
		c.TranslationMaxBytes = DefaultTranslationMaxBytes
	}
	def(&c.Checkpoint, time.Second)
	def(&c.FetchMaxWait, 100*time.Millisecond)
	def(&c.IdleFetchMaxWait, 5*time.Second)
	def(&c.ProduceTimeout, 5*time.Second)
	if c.ProduceWindow <= 0 || c.ProduceWindow > MaxProduceWindow {
		c.ProduceWindow = MaxProduceWindow
	}
	def(&c.RetryBackoff, 100*time.Millisecond)
	def(&c.MaxRetryBackoff, 5*time.Second)
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = 16 << 20
	}
	if c.PartitionBytes == 0 {
		c.PartitionBytes = 2 << 20
	}
	if c.OffsetsTopic == "" {
		c.OffsetsTopic = "__kmirror_offsets"
	}
	if c.StateTopic == "" {
		c.StateTopic = "__kmirror_state"
	}
	if c.InternalRF == 0 {
		c.InternalRF = -1
	}
	if c.ClientID == "" {
		c.ClientID = "kmirror"
	}
}
