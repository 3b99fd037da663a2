package raftstore

import (
	"fmt"
	"maps"
	"slices"
)

// TopicState is the state of a mirror topic or of one of its partitions
// (design.md section 7). Stored as text so snapshots stay readable.
type TopicState string

const (
	StatePending   TopicState = "PENDING"   // destination topic being created
	StateMirroring TopicState = "MIRRORING" // data flowing
	StatePaused    TopicState = "PAUSED"    // operator paused; no fetching
	StateStopping  TopicState = "STOPPING"  // remove requested: draining
	StateStopped   TopicState = "STOPPED"   // failed over; destination writable
	StateFailed    TopicState = "FAILED"    // retrying with backoff, Reason says why
	StateDiverged  TopicState = "DIVERGED"  // needs an operator, Reason says why
)

// Mirror is one source cluster connection and what it mirrors.
type Mirror struct {
	Name string `json:"name"`
	// Bootstrap is the source cluster's bootstrap.servers list.
	Bootstrap []string `json:"bootstrap"`
	// Properties are the source connection properties as given (Kafka style,
	// without secrets: secrets are referenced by file path).
	Properties map[string]string `json:"properties,omitempty"`
	// SourceClusterID is the source cluster ID seen when the mirror was created.
	SourceClusterID string `json:"source_cluster_id,omitempty"`
	// Include and Exclude are the mirror's topic patterns (Go regular
	// expressions, RE2, matching whole topic names; kmirror add --include
	// and --exclude): the leader adds every source topic that matches an
	// include pattern and no exclude pattern (issue 21).
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Skipped names the source topics the patterns match that the leader's
	// last discovery did not add, each with why (mirrored by another
	// mirror, removed from this one, refused by add).
	Skipped map[string]string `json:"skipped,omitempty"`
	// SyncedACLs are the destination ACL bindings the mirror's ACL sync
	// created (acls.sync), so any leader deletes them once the source no
	// longer has them, and never touches bindings it did not create.
	SyncedACLs []ACLBinding `json:"synced_acls,omitempty"`
	// Notes name what the two clusters' Kafka versions turn off for this
	// mirror (issue 21: never a silent gap), as the leader's last config
	// sync round found them.
	Notes []string `json:"notes,omitempty"`
	// HookRuns are the mirror's failover hook runs, pending and the last
	// finished ones (hooks.go).
	HookRuns []HookRun `json:"hook_runs,omitempty"`
}

// ACLBinding is one Kafka ACL binding, with the protocol's enum values
// (resource type 2 topic, 3 group; pattern 3 literal; permission 2 deny,
// 3 allow).
type ACLBinding struct {
	ResourceType int8   `json:"resource_type"`
	Name         string `json:"name"`
	PatternType  int8   `json:"pattern_type"`
	Principal    string `json:"principal"`
	Host         string `json:"host"`
	Operation    int8   `json:"operation"`
	Permission   int8   `json:"permission"`
}

// PartitionKey names one mirrored partition.
type PartitionKey struct {
	Mirror    string `json:"mirror"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

func (k PartitionKey) String() string {
	return fmt.Sprintf("%s/%s/%d", k.Mirror, k.Topic, k.Partition)
}

// Position is the last mirrored position of a partition, recorded when a
// topic stops mirroring (failover record, design.md section 8).
type Position struct {
	SourceOffset      int64  `json:"source_offset"`      // next source offset not mirrored
	DestinationOffset int64  `json:"destination_offset"` // next destination offset
	SourceLeaderEpoch int32  `json:"source_leader_epoch"`
	SourceClusterID   string `json:"source_cluster_id"`
	SourceTopicID     string `json:"source_topic_id"`
}

// ProducerIdentity is the idempotent producer identity owned by one
// destination partition (design.md section 4, rule 1).
type ProducerIdentity struct {
	ProducerID int64 `json:"producer_id"`
	Epoch      int16 `json:"epoch"`
	// Allocated tells a real identity from the zero value: Kafka hands out
	// producer ID 0 epoch 0 too.
	Allocated bool `json:"allocated"`
}

// Checkpoint is an owner's exact final position of a partition it handed
// off: the next owner continues from it without a walk.
type Checkpoint struct {
	SourceOffset      int64 `json:"source_offset"`      // next source offset to mirror
	DestinationOffset int64 `json:"destination_offset"` // next destination offset
	SourceLeaderEpoch int32 `json:"source_leader_epoch"`
	// Sequence is the next sequence number of Producer.
	Sequence int32            `json:"sequence"`
	Producer ProducerIdentity `json:"producer"`
}

// PartitionInfo is the control-plane state of one mirrored partition.
type PartitionInfo struct {
	State  TopicState `json:"state"`
	Reason string     `json:"reason,omitempty"`
	// StateSinceMs is when the partition entered State (Unix ms, the
	// leader's clock when it appended the change; 0: unknown, a change
	// made by an older build). Failures counts how often it went FAILED
	// or DIVERGED since it was added (describe --failed).
	StateSinceMs int64 `json:"state_since_ms,omitempty"`
	Failures     int   `json:"failures,omitempty"`
	// Owner is the member ID that leases the partition; Generation is the
	// raft index of the command that last changed the lease (owner or
	// producer identity), so it never repeats and a stale owner can tell.
	Owner      string `json:"owner,omitempty"`
	Generation uint64 `json:"generation"`
	// MoveTo is the member the owner is asked to hand the partition to.
	MoveTo string `json:"move_to,omitempty"`
	// Handoff is the checkpoint the last owner released the partition at;
	// nil when the next owner must walk (first start, crash takeover).
	Handoff *Checkpoint `json:"handoff,omitempty"`
	// Producer is zero until the first owner allocates it.
	Producer ProducerIdentity `json:"producer"`
	// StartOffset is the source offset mirroring starts from, resolved when
	// the topic was added (earliest or latest at that moment).
	StartOffset int64 `json:"start_offset"`
	// LastMirrored is set when the topic stops (STOPPED).
	LastMirrored *Position `json:"last_mirrored,omitempty"`
	// UnverifiedEnd is, for a STOPPED partition, the destination offset
	// (exclusive) up to which records past LastMirrored could not be
	// verified against the source at the stop (0: none); cleared when they
	// are settled (SettleStopped).
	UnverifiedEnd int64 `json:"unverified_end,omitempty"`
	// StoppedAtMs is when the partition stopped (Unix ms, as its owner
	// reported it; 0: unknown): the leader watches it for late batches
	// of kmirror's for a while after (LateBatches).
	StoppedAtMs int64 `json:"stopped_at_ms,omitempty"`
	// LateBatches names the batches of kmirror's producer found in the
	// STOPPED partition after its recorded position (at most
	// maxLateBatches, the first ones); LateRecords counts their records
	// and LateEnd is the destination offset after the last one counted.
	LateBatches []LateBatch `json:"late_batches,omitempty"`
	LateRecords int64       `json:"late_records,omitempty"`
	LateEnd     int64       `json:"late_end,omitempty"`
	// AcceptGap lets the next start of the partition skip source records
	// deleted before they were mirrored (kmirror resume --accept-gap);
	// cleared when the gap is recorded.
	AcceptGap bool `json:"accept_gap,omitempty"`
	// GapBelow is, for a partition DIVERGED by source records deleted
	// before they were mirrored, the source's log start it saw: the gap
	// an operator accepts with resume --accept-gap ends there.
	GapBelow int64 `json:"gap_below,omitempty"`
	// AcceptGapBelow is the source offset the accepted gap may reach at
	// most (exclusive): the source's log start when it was accepted.
	AcceptGapBelow int64 `json:"accept_gap_below,omitempty"`
	// SkippedRecords counts source offsets skipped under AcceptGap;
	// LastGap describes the latest gap ("100..149").
	SkippedRecords int64  `json:"skipped_records,omitempty"`
	LastGap        string `json:"last_gap,omitempty"`
}

// LateBatch is a batch of kmirror's producer that landed in a STOPPED
// partition after its recorded last mirrored position (RecordLateBatch).
type LateBatch struct {
	// FirstOffset and LastOffset are its destination offsets.
	FirstOffset int64 `json:"first_offset"`
	LastOffset  int64 `json:"last_offset"`
	ProducerID  int64 `json:"producer_id"`
	Epoch       int16 `json:"epoch"`
	// BaseSequence is the producer sequence of its first record.
	BaseSequence int32 `json:"base_sequence"`
	Records      int32 `json:"records"`
}

// String describes a late batch for logs and describe's REASON.
func (b LateBatch) String() string {
	return fmt.Sprintf("destination offsets %d..%d (%d records, producer ID %d epoch %d, sequences %d..%d)",
		b.FirstOffset, b.LastOffset, b.Records, b.ProducerID, b.Epoch, b.BaseSequence, b.BaseSequence+b.Records-1)
}

// MirrorTopic is one topic mirrored by a mirror.
type MirrorTopic struct {
	Mirror string     `json:"mirror"`
	Topic  string     `json:"topic"`
	State  TopicState `json:"state"`
	Reason string     `json:"reason,omitempty"`
	// SourceTopicID and DestTopicID are the topic IDs (KIP-516) seen when
	// the topic was added and the destination topic created; a topic
	// found under another ID was recreated (a divergence).
	SourceTopicID string `json:"source_topic_id"`
	DestTopicID   string `json:"dest_topic_id"`
	// ConfigSyncError is why the leader's last copy of changed source
	// configs to the destination topic failed, in the broker's words
	// ("" when it did not); it is tried again every
	// topics.config.sync.interval.
	ConfigSyncError string `json:"config_sync_error,omitempty"`
	// DestinationConfigs and ReplicationFactor are what the destination
	// topic is created with (the source's effective configs, see
	// kafka.Admin.TopicConfigs), kept so a leader that takes over a
	// PENDING topic creates it the same way.
	DestinationConfigs map[string]string `json:"destination_configs,omitempty"`
	ReplicationFactor  int16             `json:"replication_factor,omitempty"`
	// DeferredConfigs are the source's compaction configs, applied to the
	// destination topic once every partition p is mirrored past
	// DeferUntil[p] (the source's high watermark at add): until then the
	// destination is cleanup.policy=delete, so keyless records written
	// before the source became compacted are accepted
	// (kafka.DeferCompaction). Empty once applied.
	DeferredConfigs map[string]string `json:"deferred_configs,omitempty"`
	DeferUntil      []int64           `json:"defer_until,omitempty"`
	// Partitions is indexed by partition number.
	Partitions []PartitionInfo `json:"partitions"`
}

// GroupRestore is one destination consumer group's committed position on
// a partition of a topic that add --truncate deleted for its rebuild
// (Kafka drops a deleted topic's committed offsets). SourceOffset is that
// position in the source's offsets: the destination commit, at most the
// truncation point (the first divergent offset), mapped through the old
// mirror's translation, so group sync translates it into the rebuilt topic
// like a source commit.
type GroupRestore struct {
	Group     string `json:"group"`
	Partition int32  `json:"partition"`
	// DestinationCommitted is the group's commit on the deleted topic
	// (destination offsets) and SourceOffset what it is given back as.
	DestinationCommitted int64  `json:"destination_committed"`
	SourceOffset         int64  `json:"source_offset"`
	Metadata             string `json:"metadata,omitempty"`
}

// Member is one kmirror daemon of the group.
type Member struct {
	ID       string `json:"id"`
	RaftAddr string `json:"raft_addr"`
	HTTPAddr string `json:"http_addr"`
	Voter    bool   `json:"voter"`
	Draining bool   `json:"draining"`
	// Joined is set once the member has run with raft state; a member with
	// an empty data directory whose ID has joined is a wiped member and is
	// refused (it could vote twice in a term).
	Joined bool `json:"joined"`
	// LeaseTTLMs is the member's own lease_ttl, milliseconds, as it
	// announced it (0: not announced, an older build): the leader takes
	// the member's partitions over only once neither its own lease_ttl nor
	// this has passed since it last heard from the member, so members
	// whose files disagree (a rolling change of lease_ttl) never overlap
	// (issue 19). The member writes nothing until its record shows it.
	LeaseTTLMs int64 `json:"lease_ttl_ms,omitempty"`
	// LeaseProtocol is the lease protocol the member runs, as it
	// announced it: 0 (an older build) renews its lease by raft's
	// heartbeats alone; LeaseProtocolGrant asks the leader for it
	// (POST /v1/internal/lease, design.md section 3), and the leader takes
	// its partitions over lease_ttl after it last granted one.
	LeaseProtocol int `json:"lease_protocol,omitempty"`
}

// LeaseProtocolGrant is Member.LeaseProtocol of a member that asks the
// leader for its lease (issue 19).
const LeaseProtocolGrant = 1

// State is the whole replicated control-plane state held by the FSM.
type State struct {
	Mirrors map[string]*Mirror `json:"mirrors"`
	// Topics is keyed by TopicKey(mirror, topic).
	Topics  map[string]*MirrorTopic `json:"topics"`
	Members map[string]*Member      `json:"members"`
	// WriteDenials are the DENY WRITE ACLs kmirror put on destination
	// topics (KIP-1279: mirror topics are read-only), by destination topic
	// name: the principals denied. Recorded before the ACLs are created
	// and cleared after they are deleted, so a failover removes exactly
	// kmirror's own ACLs, also after a leader change.
	WriteDenials map[string][]string `json:"write_denials,omitempty"`
	// StopFences are the DENY WRITE ACLs for kmirror's own principal on
	// STOPPED destination topics (issue 19: a produce request the network
	// held past its sender's lease is refused by the broker after the
	// stop), by destination topic name: the principal denied. Recorded
	// before the ACL is created, cleared once an add of the topic deleted
	// it.
	StopFences map[string]string `json:"stop_fences,omitempty"`
	// GroupRestores are the consumer group positions a truncation took
	// from the destination, by TopicKey(mirror, topic): group sync gives
	// each back once the rebuilt topic is mirrored past it (issue 21,
	// section 4), then clears it.
	GroupRestores map[string][]GroupRestore `json:"group_restores,omitempty"`
	// Index is the raft index of the last command applied to this state.
	Index uint64 `json:"index"`
	// appendedAtMs is when the leader appended the entry being applied
	// (raft.Log.AppendedAt, Unix ms; 0 when unknown): the same on every
	// member, so applies may record it.
	appendedAtMs int64
}

// NewState returns an empty state with all maps allocated.
func NewState() *State {
	return &State{
		Mirrors: make(map[string]*Mirror),
		Topics:  make(map[string]*MirrorTopic),
		Members: make(map[string]*Member),
	}
}

// TopicKey is the State.Topics key of a mirror topic. Mirror names cannot
// contain "/" (CreateMirror rejects them), so the key is unambiguous.
func TopicKey(mirror, topic string) string {
	return mirror + "/" + topic
}

// Topic returns the mirror topic (mirror, topic) if it exists.
func (s *State) Topic(mirror, topic string) (*MirrorTopic, bool) {
	t, ok := s.Topics[TopicKey(mirror, topic)]
	return t, ok
}

// Partition returns the partition named by k if it exists.
func (s *State) Partition(k PartitionKey) (*PartitionInfo, bool) {
	t, ok := s.Topic(k.Mirror, k.Topic)
	if !ok || k.Partition < 0 || int(k.Partition) >= len(t.Partitions) {
		return nil, false
	}
	return &t.Partitions[k.Partition], true
}

// Clone returns a deep copy that shares no memory with s.
func (s *State) Clone() *State {
	c := &State{
		Mirrors: make(map[string]*Mirror, len(s.Mirrors)),
		Topics:  make(map[string]*MirrorTopic, len(s.Topics)),
		Members: make(map[string]*Member, len(s.Members)),
		Index:   s.Index,
	}
	for k, m := range s.Mirrors {
		c.Mirrors[k] = m.Clone()
	}
	for k, t := range s.Topics {
		c.Topics[k] = t.Clone()
	}
	for k, m := range s.Members {
		mm := *m
		c.Members[k] = &mm
	}
	if s.WriteDenials != nil {
		c.WriteDenials = make(map[string][]string, len(s.WriteDenials))
		for k, v := range s.WriteDenials {
			c.WriteDenials[k] = slices.Clone(v)
		}
	}
	c.StopFences = maps.Clone(s.StopFences)
	if s.GroupRestores != nil {
		c.GroupRestores = make(map[string][]GroupRestore, len(s.GroupRestores))
		for k, v := range s.GroupRestores {
			c.GroupRestores[k] = slices.Clone(v)
		}
	}
	return c
}

// Clone returns a deep copy of m.
func (m *Mirror) Clone() *Mirror {
	c := *m
	c.Bootstrap = slices.Clone(m.Bootstrap)
	c.Properties = maps.Clone(m.Properties)
	c.Include, c.Exclude = slices.Clone(m.Include), slices.Clone(m.Exclude)
	c.Skipped = maps.Clone(m.Skipped)
	c.SyncedACLs = slices.Clone(m.SyncedACLs)
	c.Notes = slices.Clone(m.Notes)
	if m.HookRuns != nil {
		c.HookRuns = make([]HookRun, len(m.HookRuns))
		for i, r := range m.HookRuns {
			c.HookRuns[i] = r.Clone()
		}
	}
	return &c
}

// Clone returns a deep copy of t.
func (t *MirrorTopic) Clone() *MirrorTopic {
	c := *t
	c.DestinationConfigs = maps.Clone(t.DestinationConfigs)
	c.DeferredConfigs = maps.Clone(t.DeferredConfigs)
	c.DeferUntil = slices.Clone(t.DeferUntil)
	if t.Partitions != nil {
		c.Partitions = make([]PartitionInfo, len(t.Partitions))
		for i, p := range t.Partitions {
			if p.LastMirrored != nil {
				pos := *p.LastMirrored
				p.LastMirrored = &pos
			}
			if p.Handoff != nil {
				h := *p.Handoff
				p.Handoff = &h
			}
			c.Partitions[i] = p
		}
	}
	return &c
}
