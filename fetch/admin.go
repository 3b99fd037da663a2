package fetch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/segmentio/kafka-go/protocol/createtopics"
	"github.com/segmentio/kafka-go/protocol/describeconfigs"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
	"github.com/segmentio/kafka-go/protocol/listoffsets"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// ErrTopicNotFound is returned when a topic does not exist.
var ErrTopicNotFound = errors.New("topic does not exist")

// Admin runs the occasional administrative requests kmirror needs against
// one cluster: topic metadata and configs, offsets, topic creation,
// producer IDs.
type Admin struct {
	cl *cluster
}

// NewAdmin returns an Admin for the cluster at bootstrap; name is how
// errors call the cluster ("source cluster of mirror m1").
func NewAdmin(name string, bootstrap []string, clientID string, tlsConfig *tls.Config) *Admin {
	return &Admin{cl: newCluster(name, bootstrap, clientID, tlsConfig)}
}

// Close releases connections.
func (a *Admin) Close() { a.cl.close() }

// ClusterID checks the cluster answers and returns its ID.
func (a *Admin) ClusterID(ctx context.Context) (string, error) {
	md, err := a.cl.metadata(ctx, 0)
	if err != nil {
		return "", err
	}
	return md.ClusterID, nil
}

// Partitions returns a topic's partition count, or ErrTopicNotFound.
func (a *Admin) Partitions(ctx context.Context, topic string) (int, error) {
	a.cl.watch(topic)
	md, err := a.cl.metadata(ctx, 0)
	if err != nil {
		return 0, err
	}
	if code, ok := md.TopicErrors[topic]; ok {
		if code == kwire.CodeUnknownTopicOrPartition {
			return 0, fmt.Errorf("%w: %s on %s", ErrTopicNotFound, topic, a.cl.name)
		}
		return 0, &kwire.Error{Code: code, Topic: topic, Partition: -1, Op: "metadata of " + a.cl.name}
	}
	parts, ok := md.Topics[topic]
	if !ok {
		return 0, fmt.Errorf("metadata of %s does not mention topic %s", a.cl.name, topic)
	}
	return len(parts), nil
}

// mirroredConfigs are the topic configs copied to a destination topic when
// the source sets them explicitly. min.insync.replicas is not among them
// (MirrorMaker 2 leaves it out too): durability on the destination depends
// on the destination's brokers, and a value above the destination's
// replication factor would block every write.
var mirroredConfigs = []string{
	"cleanup.policy", "retention.ms", "retention.bytes", "max.message.bytes",
	"compression.type", "segment.bytes", "segment.ms", "min.compaction.lag.ms",
	"max.compaction.lag.ms", "delete.retention.ms", "min.cleanable.dirty.ratio",
}

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
// (source) topic: the source's non-default configs among those kmirror
// mirrors, plus MirrorTopicConfigs.
func (a *Admin) TopicConfigs(ctx context.Context, topic string) (map[string]string, error) {
	msg, err := a.cl.roundTrip(ctx, &describeconfigs.Request{Resources: []describeconfigs.RequestResource{{
		ResourceType: 2, // topic
		ResourceName: topic,
		ConfigNames:  mirroredConfigs,
	}}})
	if err != nil {
		return nil, fmt.Errorf("describe configs of %s on %s: %w", topic, a.cl.name, err)
	}
	out := map[string]string{}
	for _, r := range msg.(*describeconfigs.Response).Resources {
		if r.ErrorCode != 0 {
			return nil, fmt.Errorf("describe configs of %s on %s: %w", topic, a.cl.name,
				&kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "describe configs"})
		}
		for _, e := range r.ConfigEntries {
			// ConfigSource 1 = DYNAMIC_TOPIC_CONFIG: set on the topic itself.
			if e.ConfigSource == 1 {
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
		return fmt.Errorf("create topic %s on %s: %w", topic, a.cl.name, err)
	}
	for _, t := range msg.(*createtopics.Response).Topics {
		if t.ErrorCode != 0 {
			kerr := &kwire.Error{Code: t.ErrorCode, Topic: topic, Partition: -1, Op: "create topic on " + a.cl.name}
			if t.ErrorMessage != "" {
				return fmt.Errorf("%w (%s)", kerr, t.ErrorMessage)
			}
			return kerr
		}
	}
	a.cl.watch(topic)
	for {
		md, err := a.cl.metadata(ctx, 0)
		if err == nil {
			if parts, ok := md.Topics[topic]; ok && len(parts) == partitions && allLed(parts) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s on %s has no leader for every partition yet: %w", topic, a.cl.name, ctx.Err())
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
// Leader moves and not-yet-ready partitions are retried until ctx ends.
func (a *Admin) Offsets(ctx context.Context, topic string, partitions int, which int64) ([]int64, error) {
	out := make([]int64, partitions)
	for p := 0; p < partitions; p++ {
		for {
			off, err := a.offset(ctx, topic, int32(p), which)
			if err == nil {
				out[p] = off
				break
			}
			var kerr *kwire.Error
			if !errors.As(err, &kerr) || kerr.Action() == kwire.Fatal {
				return nil, err
			}
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return out, nil
}

func (a *Admin) offset(ctx context.Context, topic string, p int32, which int64) (int64, error) {
	_, addr, epoch, err := a.cl.leader(ctx, topic, p, 0)
	if err != nil {
		return 0, err
	}
	conn, err := a.cl.dial(ctx, addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	msg, err := conn.RoundTrip(ctx, &listoffsets.Request{
		ReplicaID:      -1,
		IsolationLevel: 1,
		Topics: []listoffsets.RequestTopic{{Topic: topic, Partitions: []listoffsets.RequestPartition{{
			Partition: p, CurrentLeaderEpoch: epoch, Timestamp: which,
		}}}},
	})
	if err != nil {
		return 0, fmt.Errorf("list offsets of %s/%d on %s: %w", topic, p, a.cl.name, err)
	}
	res := msg.(*listoffsets.Response)
	if len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 {
		return 0, fmt.Errorf("list offsets of %s/%d on %s: malformed response", topic, p, a.cl.name)
	}
	rp := res.Topics[0].Partitions[0]
	if rp.ErrorCode != 0 {
		return 0, &kwire.Error{Code: rp.ErrorCode, Topic: topic, Partition: p, Op: "list offsets on " + a.cl.name}
	}
	return rp.Offset, nil
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
	md, err := a.cl.metadata(ctx, time.Minute)
	if err != nil {
		return ProducerID{}, err
	}
	var lastErr error
	for _, addr := range md.Brokers {
		conn, err := a.cl.dial(ctx, addr)
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
			lastErr = &kwire.Error{Code: res.ErrorCode, Op: "init producer ID on " + a.cl.name}
			continue
		}
		return ProducerID{ID: res.ProducerID, Epoch: res.ProducerEpoch}, nil
	}
	return ProducerID{}, fmt.Errorf("allocate a producer ID on %s: %w", a.cl.name, lastErr)
}
