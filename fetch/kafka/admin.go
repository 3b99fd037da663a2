package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go/protocol/createpartitions"
	"github.com/segmentio/kafka-go/protocol/createtopics"
	"github.com/segmentio/kafka-go/protocol/describeconfigs"
	"github.com/segmentio/kafka-go/protocol/incrementalalterconfigs"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ErrTopicNotFound is returned when a topic does not exist.
var ErrTopicNotFound = errors.New("topic does not exist")

// Admin runs the occasional administrative requests kmirror needs against
// one cluster: topic metadata and configs, offsets, topic creation,
// producer IDs.
type Admin struct {
	cl    *Cluster
	coord coordinators
}

// NewAdmin returns an Admin for the cluster at bootstrap; name is how
// errors call the cluster ("source cluster of mirror m1").
// security secures its connections (nil: PLAINTEXT).
func NewAdmin(name string, bootstrap []string, clientID string, security Security) *Admin {
	return &Admin{cl: NewCluster(name, bootstrap, clientID, security)}
}

// Cluster is the cluster the admin client talks to (for the data path's
// readers of the same cluster).
func (a *Admin) Cluster() *Cluster { return a.cl }

// Close releases connections.
func (a *Admin) Close() { a.cl.Close() }

// ClusterID checks the cluster answers and returns its ID.
func (a *Admin) ClusterID(ctx context.Context) (string, error) {
	md, err := a.cl.Metadata(ctx, 0)
	if err != nil {
		return "", err
	}
	return md.ClusterID, nil
}

// TopicMeta is what metadata says about one topic.
type TopicMeta struct {
	Partitions int
	// ID is the topic ID (KIP-516) in Kafka's text form; "" from brokers
	// older than Kafka 2.8.
	ID string
}

// Topic describes a topic, or returns an error wrapping ErrTopicNotFound.
func (a *Admin) Topic(ctx context.Context, topic string) (TopicMeta, error) {
	a.cl.Watch(topic)
	md, err := a.cl.Metadata(ctx, 0)
	if err != nil {
		return TopicMeta{}, err
	}
	if code, ok := md.TopicErrors[topic]; ok {
		if code == kwire.CodeUnknownTopicOrPartition {
			return TopicMeta{}, fmt.Errorf("%w: %s on %s", ErrTopicNotFound, topic, a.cl.Name)
		}
		return TopicMeta{}, &kwire.Error{Code: code, Topic: topic, Partition: -1, Op: "metadata of " + a.cl.Name}
	}
	parts, ok := md.Topics[topic]
	if !ok {
		return TopicMeta{}, fmt.Errorf("metadata of %s does not mention topic %s", a.cl.Name, topic)
	}
	return TopicMeta{Partitions: len(parts), ID: md.TopicIDs[topic]}, nil
}

// ListTopics returns every topic the cluster's metadata lists (with the
// topics the client may describe, when an authorizer runs), by name. It
// asks a broker each time (no cache) and leaves the cluster's watched
// metadata alone. Topics whose metadata carries an error are left out.
func (a *Admin) ListTopics(ctx context.Context) (map[string]TopicMeta, error) {
	if err := a.cl.lock(ctx); err != nil {
		return nil, err
	}
	defer a.cl.unlock()
	var md *kwire.Metadata
	err := a.cl.withCtrlLocked(ctx, func(ctx context.Context, conn *kwire.Conn) (err error) {
		md, err = conn.Metadata(ctx, nil)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list the topics of %s: %w", a.cl.Name, err)
	}
	out := make(map[string]TopicMeta, len(md.Topics))
	for t, parts := range md.Topics {
		out[t] = TopicMeta{Partitions: len(parts), ID: md.TopicIDs[t]}
	}
	return out, nil
}

// Partitions returns a topic's partition count, or ErrTopicNotFound.
func (a *Admin) Partitions(ctx context.Context, topic string) (int, error) {
	tm, err := a.Topic(ctx, topic)
	return tm.Partitions, err
}

// mirroredConfigs are the topic configs a destination topic takes from its
// source topic, with the source's effective value whatever level set it:
// the topic itself, a broker's dynamic or static config, or Kafka's
// default. A value set only on the source brokers (message.max.bytes=3 MiB
// in server.properties) must reach the destination topic too, or the
// destination refuses records the source accepted; and a destination
// broker with other defaults must not change how long records are kept.
//
//   - limits: max.message.bytes;
//   - retention: retention.ms, retention.bytes, delete.retention.ms;
//   - cleanup and compaction: cleanup.policy, min.compaction.lag.ms,
//     max.compaction.lag.ms, min.cleanable.dirty.ratio;
//   - storage: compression.type, segment.bytes, segment.ms.
//
// Left out on purpose: min.insync.replicas (MirrorMaker 2 leaves it out
// too: durability on the destination depends on the destination's brokers,
// and a value above the destination's replication factor would block every
// write); the message.timestamp.* configs (MirrorTopicConfigs sets them);
// tiered-storage and follower-throttling configs, which name resources of
// the source cluster.
var mirroredConfigs = []string{
	"cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes",
	"compression.type", "segment.bytes", "segment.ms", "min.compaction.lag.ms",
	"max.compaction.lag.ms", "delete.retention.ms", "min.cleanable.dirty.ratio",
}

// MirroredConfigNames returns the names of mirroredConfigs (a copy).
func MirroredConfigNames() []string { return slices.Clone(mirroredConfigs) }

// MirrorTopicConfigs are set on every destination topic kmirror creates,
// over whatever the source has. Destination batches always carry
// CreateTime (LogAppendTime batches are re-encoded with the source's
// append time as CreateTime), so consumers of both clusters see the same
// timestamps; and the timestamp window checks are off, because the broker
// checks them against the time kmirror writes, so a backlog older than the
// source's window would never be accepted.
var MirrorTopicConfigs = map[string]string{
	"message.timestamp.type":          "CreateTime",
	"message.timestamp.before.max.ms": "9223372036854775807",
	"message.timestamp.after.max.ms":  "9223372036854775807",
}

// TopicConfigs returns the configs of a destination topic mirroring this
// (source) topic: the source's effective value of every config in
// mirroredConfigs, plus MirrorTopicConfigs.
func (a *Admin) TopicConfigs(ctx context.Context, topic string) (map[string]string, error) {
	msg, err := a.cl.roundTrip(ctx, &describeconfigs.Request{Resources: []describeconfigs.RequestResource{{
		ResourceType: 2, // topic
		ResourceName: topic,
		ConfigNames:  mirroredConfigs,
	}}})
	if err != nil {
		return nil, fmt.Errorf("describe configs of %s on %s: %w", topic, a.cl.Name, err)
	}
	out := map[string]string{}
	for _, r := range msg.(*describeconfigs.Response).Resources {
		if r.ErrorCode != 0 {
			return nil, fmt.Errorf("describe configs of %s on %s: %w", topic, a.cl.Name,
				&kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "describe configs"})
		}
		for _, e := range r.ConfigEntries {
			// Every level counts (ConfigSource: topic, dynamic broker,
			// dynamic default broker, static broker, default): the
			// effective value is what the source applies. A sensitive
			// value comes back null and is not copied.
			if !e.IsSensitive && e.ConfigValue != "" {
				out[e.ConfigName] = e.ConfigValue
			}
		}
	}
	for k, v := range MirrorTopicConfigs {
		out[k] = v
	}
	return out, nil
}

// CreateTopic creates a topic; rf <= 0 takes the broker default. It
// returns once every partition has a leader.
func (a *Admin) CreateTopic(ctx context.Context, topic string, partitions int, rf int16, configs map[string]string) error {
	if rf <= 0 {
		rf = -1
	}
	rt := createtopics.RequestTopic{Name: topic, NumPartitions: int32(partitions), ReplicationFactor: rf}
	names := make([]string, 0, len(configs))
	for k := range configs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		rt.Configs = append(rt.Configs, createtopics.RequestConfig{Name: k, Value: configs[k]})
	}
	msg, err := a.cl.roundTrip(ctx, &createtopics.Request{Topics: []createtopics.RequestTopic{rt}, TimeoutMs: 30000})
	if err != nil {
		return fmt.Errorf("create topic %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, t := range msg.(*createtopics.Response).Topics {
		if t.ErrorCode != 0 {
			return &AdminError{Err: &kwire.Error{Code: t.ErrorCode, Topic: topic, Partition: -1, Op: "create topic on " + a.cl.Name},
				Message: t.ErrorMessage}
		}
	}
	return a.waitLed(ctx, topic, partitions)
}

// AdminError is a broker's refusal of an administrative request, with the
// broker's own words (ErrorMessage) when it gave any.
type AdminError struct {
	Err     *kwire.Error
	Message string
}

func (e *AdminError) Error() string {
	if e.Message != "" {
		return fmt.Sprintf("%v (%s)", e.Err, e.Message)
	}
	return e.Err.Error()
}

func (e *AdminError) Unwrap() error { return e.Err }

// Broker error codes of topic administration that mean the request itself
// was wrong (a bad name, more replicas than brokers, a config value the
// broker refuses): the caller must change it, retrying cannot help.
var requestErrors = map[int16]bool{
	17: true, // INVALID_TOPIC_EXCEPTION
	37: true, // INVALID_PARTITIONS
	38: true, // INVALID_REPLICATION_FACTOR
	39: true, // INVALID_REPLICA_ASSIGNMENT
	40: true, // INVALID_CONFIG
	44: true, // POLICY_VIOLATION
}

// IsRequestError reports whether err is a broker's refusal of the request
// as given (see requestErrors).
func IsRequestError(err error) bool {
	var ae *AdminError
	return errors.As(err, &ae) && requestErrors[ae.Err.Code]
}

// IsTopicExists reports whether err says the topic already exists.
func IsTopicExists(err error) bool {
	var kerr *kwire.Error
	return errors.As(err, &kerr) && kerr.Code == kwire.CodeTopicAlreadyExists
}

// AlterTopicConfigs sets configs of a topic (IncrementalAlterConfigs,
// SET), leaving its other configs as they are.
func (a *Admin) AlterTopicConfigs(ctx context.Context, topic string, configs map[string]string) error {
	res := incrementalalterconfigs.RequestResource{ResourceType: 2, ResourceName: topic}
	names := make([]string, 0, len(configs))
	for k := range configs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		res.Configs = append(res.Configs, incrementalalterconfigs.RequestConfig{Name: k, Value: configs[k]})
	}
	msg, err := a.cl.roundTrip(ctx, &incrementalalterconfigs.Request{Resources: []incrementalalterconfigs.RequestResource{res}})
	if err != nil {
		return fmt.Errorf("alter configs of %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, r := range msg.(*incrementalalterconfigs.Response).Responses {
		if r.ErrorCode != 0 {
			return &AdminError{Err: &kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "alter topic configs on " + a.cl.Name},
				Message: r.ErrorMessage}
		}
	}
	return nil
}

// DeferCompaction splits the configs of a destination topic whose source is
// compacted: a compacted topic refuses records without a key, but the
// source may still hold keyless records written before its cleanup.policy
// became compact (the source broker refuses new ones from then on, and
// only its cleaner removes the old). So the destination topic starts with
// cleanup.policy=delete and unlimited retention, and deferred (the
// source's cleanup.policy and retention) is applied once every partition is
// mirrored past the source's high watermark at add: no keyless record can
// lie beyond it. It returns configs unchanged and nil for other topics.
func DeferCompaction(configs map[string]string) (create, deferred map[string]string) {
	if !strings.Contains(configs["cleanup.policy"], "compact") {
		return configs, nil
	}
	create, deferred = maps.Clone(configs), map[string]string{}
	for k, v := range map[string]string{"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"} {
		if old, ok := configs[k]; ok {
			deferred[k] = old
		}
		create[k] = v
	}
	return create, deferred
}

// CreatePartitions grows a topic to count partitions and waits until every
// partition has a leader. A topic that already has count partitions is
// left as it is (INVALID_PARTITIONS from the broker is then not an error).
func (a *Admin) CreatePartitions(ctx context.Context, topic string, count int) error {
	msg, err := a.cl.roundTrip(ctx, &createpartitions.Request{
		Topics: []createpartitions.RequestTopic{{Name: topic, Count: int32(count)}}, TimeoutMs: 30000,
	})
	if err != nil {
		return fmt.Errorf("create partitions of %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, r := range msg.(*createpartitions.Response).Results {
		if r.ErrorCode == 0 {
			continue
		}
		if r.ErrorCode == 37 { // INVALID_PARTITIONS: maybe grown already
			if tm, err := a.Topic(ctx, topic); err == nil && tm.Partitions == count {
				continue
			}
		}
		return &AdminError{Err: &kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "create partitions on " + a.cl.Name},
			Message: r.ErrorMessage}
	}
	return a.waitLed(ctx, topic, count)
}

// waitLed waits until topic has the given partition count, each with a
// leader.
func (a *Admin) waitLed(ctx context.Context, topic string, partitions int) error {
	a.cl.Watch(topic)
	for {
		md, err := a.cl.Metadata(ctx, 0)
		if err == nil {
			if parts, ok := md.Topics[topic]; ok && len(parts) == partitions && allLed(parts) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s on %s has no leader for every partition yet: %w", topic, a.cl.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allLed(parts []kwire.PartitionMeta) bool {
	for _, p := range parts {
		if p.Leader < 0 {
			return false
		}
	}
	return true
}

// Offset specifiers for Offsets.
const (
	Earliest int64 = -2
	Latest   int64 = -1
)

// Offsets returns, per partition, the earliest or latest offset
// (committed: read_committed isolation, so latest is the last stable offset).
// It sends one ListOffsets request per partition leader (a topic of 200
// partitions costs a request per broker, not 200), and retries partitions
// whose leader moved or is not ready until ctx ends.
func (a *Admin) Offsets(ctx context.Context, topic string, partitions int, which int64) ([]int64, error) {
	return a.offsets(ctx, topic, partitions, which, 1)
}

// HighWatermarks returns every partition's high watermark (read_uncommitted
// latest offset): the end of everything written, committed or not.
func (a *Admin) HighWatermarks(ctx context.Context, topic string, partitions int) ([]int64, error) {
	return a.offsets(ctx, topic, partitions, Latest, 0)
}

func (a *Admin) offsets(ctx context.Context, topic string, partitions int, which int64, isolation int8) ([]int64, error) {
	out := make([]int64, partitions)
	left := make([]int32, partitions)
	for p := range left {
		left[p] = int32(p)
	}
	for {
		retry, err := a.offsetsOnce(ctx, topic, left, which, isolation, out)
		if err != nil {
			return nil, err
		}
		if len(retry) == 0 {
			return out, nil
		}
		left = retry
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("list offsets of %s on %s: %d partitions still without an answer: %w", topic, a.cl.Name, len(left), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// offsetsOnce asks each leader once for its partitions of parts; it
// returns the partitions to ask again (a retriable error or no leader).
func (a *Admin) offsetsOnce(ctx context.Context, topic string, parts []int32, which int64, isolation int8, out []int64) (retry []int32, err error) {
	type leaderReq struct {
		addr  string
		parts []listoffsets.RequestPartition
	}
	byLeader := map[int32]*leaderReq{}
	var ids []int32
	for _, p := range parts {
		id, addr, epoch, err := a.cl.Leader(ctx, topic, p, 0)
		if err != nil {
			var kerr *kwire.Error
			if (errors.As(err, &kerr) && kerr.Action() == kwire.Fatal) || ctx.Err() != nil {
				return nil, err
			}
			retry = append(retry, p)
			continue
		}
		lr := byLeader[id]
		if lr == nil {
			lr = &leaderReq{addr: addr}
			byLeader[id] = lr
			ids = append(ids, id)
		}
		lr.parts = append(lr.parts, listoffsets.RequestPartition{Partition: p, CurrentLeaderEpoch: epoch, Timestamp: which})
	}
	for _, id := range ids {
		lr := byLeader[id]
		conn, err := a.cl.Borrow(ctx, lr.addr)
		if err != nil {
			for _, rp := range lr.parts {
				retry = append(retry, rp.Partition)
			}
			continue
		}
		rctx, cancel := ExchangeCtx(ctx)
		msg, err := conn.RoundTrip(rctx, &listoffsets.Request{ReplicaID: -1, IsolationLevel: isolation,
			Topics: []listoffsets.RequestTopic{{Topic: topic, Partitions: lr.parts}}})
		cancel()
		if err != nil {
			conn.Close()
			for _, rp := range lr.parts {
				retry = append(retry, rp.Partition)
			}
			continue
		}
		a.cl.GiveBack(lr.addr, conn)
		answered := map[int32]bool{}
		for _, t := range msg.(*listoffsets.Response).Topics {
			for _, rp := range t.Partitions {
				if t.Topic != topic || int(rp.Partition) >= len(out) || rp.Partition < 0 {
					continue
				}
				answered[rp.Partition] = true
				if rp.ErrorCode != 0 {
					kerr := &kwire.Error{Code: rp.ErrorCode, Topic: topic, Partition: rp.Partition, Op: "list offsets on " + a.cl.Name}
					if kerr.Action() == kwire.Fatal {
						return nil, kerr
					}
					retry = append(retry, rp.Partition)
					continue
				}
				out[rp.Partition] = rp.Offset
			}
		}
		for _, rp := range lr.parts {
			if !answered[rp.Partition] {
				retry = append(retry, rp.Partition)
			}
		}
	}
	return retry, nil
}

// InitProducerID allocates a fresh idempotent producer identity, waiting
// out a transaction coordinator that is still loading (a fresh cluster).
func (a *Admin) InitProducerID(ctx context.Context) (ProducerID, error) {
	for {
		id, err := a.initProducerID(ctx)
		var kerr *kwire.Error
		if err == nil || !errors.As(err, &kerr) || kerr.Action() != kwire.Retry {
			return id, err
		}
		select {
		case <-ctx.Done():
			return ProducerID{}, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (a *Admin) initProducerID(ctx context.Context) (ProducerID, error) {
	md, err := a.cl.Metadata(ctx, time.Minute)
	if err != nil {
		return ProducerID{}, err
	}
	var lastErr error
	for _, addr := range md.Brokers {
		conn, err := a.cl.Dial(ctx, addr)
		if err != nil {
			lastErr = err
			continue
		}
		msg, err := conn.RoundTrip(ctx, &initproducerid.Request{
			TransactionTimeoutMs: 60000, ProducerID: -1, ProducerEpoch: -1,
		})
		conn.Close()
		if err != nil {
			lastErr = err
			continue
		}
		res := msg.(*initproducerid.Response)
		if res.ErrorCode != 0 {
			lastErr = &kwire.Error{Code: res.ErrorCode, Op: "init producer ID on " + a.cl.Name}
			continue
		}
		return ProducerID{ID: res.ProducerID, Epoch: res.ProducerEpoch}, nil
	}
	return ProducerID{}, fmt.Errorf("allocate a producer ID on %s: %w", a.cl.Name, lastErr)
}

// IsBrokerAnswer reports whether err carries a broker's error code (a
// kwire.Error, alone or inside an AdminError): the cluster answered and
// refused. False means no answer came (dial, timeout, closed connection).
func IsBrokerAnswer(err error) bool {
	var kerr *kwire.Error
	return errors.As(err, &kerr)
}
