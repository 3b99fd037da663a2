package kwire

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strconv"

	"github.com/segmentio/kafka-go/protocol/metadata"
)

// PartitionMeta is a partition's leader as metadata reports it.
type PartitionMeta struct {
	Leader      int32
	LeaderEpoch int32
	Err         int16
}

// Metadata is the part of a Metadata response the data path uses.
type Metadata struct {
	ClusterID string
	Brokers   map[int32]string // node ID -> host:port
	// Topics maps topic -> partition -> leader; a topic with a topic-level
	// error has no partitions and an entry in TopicErrors.
	Topics      map[string][]PartitionMeta
	TopicErrors map[string]int16
	// TopicIDs maps topic -> topic ID (KIP-516) in Kafka's text form
	// (URL-safe base64, as kafka-topics.sh prints it). Empty when the
	// broker predates Metadata v10 (Kafka 2.8).
	TopicIDs map[string]string
}

const (
	apiMetadata int16 = 3
	// metadataVersion is the Metadata version kwire encodes itself: v12
	// is the first that takes topics by name and returns topic IDs
	// without cluster-authorized operations (Kafka 3.1+); older brokers
	// are asked through kafka-go at v8, without topic IDs.
	metadataVersion int16 = 12
)

// Metadata asks the broker for the given topics (all topics if nil), fresh:
// never from a cache.
func (c *Conn) Metadata(ctx context.Context, topics []string) (*Metadata, error) {
	if vr, ok := c.versions[apiMetadata]; ok && vr.min <= metadataVersion && metadataVersion <= vr.max {
		return c.metadataV12(ctx, topics)
	}
	msg, err := c.RoundTrip(ctx, &metadata.Request{TopicNames: topics})
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", c.addr, err)
	}
	res := msg.(*metadata.Response)
	md := newMetadata(res.ClusterID)
	for _, b := range res.Brokers {
		md.Brokers[b.NodeID] = net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
	}
	for _, t := range res.Topics {
		if t.ErrorCode != 0 {
			md.TopicErrors[t.Name] = t.ErrorCode
			continue
		}
		parts := make([]PartitionMeta, len(t.Partitions))
		for _, p := range t.Partitions {
			if int(p.PartitionIndex) >= len(parts) || p.PartitionIndex < 0 {
				return nil, fmt.Errorf("metadata from %s: topic %s lists partition %d of %d", c.addr, t.Name, p.PartitionIndex, len(parts))
			}
			parts[p.PartitionIndex] = PartitionMeta{Leader: p.LeaderID, LeaderEpoch: p.LeaderEpoch, Err: p.ErrorCode}
		}
		md.Topics[t.Name] = parts
	}
	return md, nil
}

func newMetadata(clusterID string) *Metadata {
	return &Metadata{ClusterID: clusterID, Brokers: map[int32]string{}, Topics: map[string][]PartitionMeta{},
		TopicErrors: map[string]int16{}, TopicIDs: map[string]string{}}
}

// FormatTopicID renders a 16-byte topic ID as Kafka does (Uuid.toString:
// URL-safe base64 without padding); the zero ID is "".
func FormatTopicID(id [16]byte) string {
	if id == ([16]byte{}) {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString(id[:])
}

// metadataV12 is Metadata v12, a flexible version (KIP-482): compact
// strings and arrays, tagged fields, request header v2, response header v1.
func (c *Conn) metadataV12(ctx context.Context, topics []string) (*Metadata, error) {
	w := c.header(apiMetadata, metadataVersion)
	w.uvarint(0) // request header tagged fields
	if topics == nil {
		w.uvarint(0) // null array: all topics
	} else {
		w.uvarint(uint64(len(topics)) + 1)
		for _, t := range topics {
			w.b = append(w.b, make([]byte, 16)...) // topic ID: zero, asked by name
			w.compactString(t)
			w.uvarint(0)
		}
	}
	w.int8(0) // allow_auto_topic_creation
	w.int8(0) // include_topic_authorized_operations
	w.uvarint(0)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", c.addr, err)
	}
	md, err := parseMetadataV12(body)
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", c.addr, err)
	}
	return md, nil
}

func parseMetadataV12(body []byte) (*Metadata, error) {
	r := reader{b: body}
	r.skipTags() // response header v1
	r.int32()    // throttle
	brokers := make(map[int32]string)
	for i, n := 0, r.compactLen(8); i < n; i++ {
		id := r.int32()
		host := r.compactString()
		port := r.int32()
		r.compactString() // rack
		r.skipTags()
		brokers[id] = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	md := newMetadata(r.compactString())
	md.Brokers = brokers
	r.int32() // controller ID
	for i, n := 0, r.compactLen(20); i < n; i++ {
		code := r.int16()
		name := r.compactString()
		var id [16]byte
		if r.need(16) {
			copy(id[:], r.b)
			r.b = r.b[16:]
		}
		r.int8() // is_internal
		np := r.compactLen(12)
		var parts []PartitionMeta
		if code == 0 {
			parts = make([]PartitionMeta, np)
		}
		for j := 0; j < np; j++ {
			pcode := r.int16()
			idx := r.int32()
			leader := r.int32()
			epoch := r.int32()
			for k := 0; k < 3; k++ { // replicas, ISR, offline replicas
				r.skip(4 * r.compactLen(4))
			}
			r.skipTags()
			if code != 0 || r.err != nil {
				continue
			}
			if idx < 0 || int(idx) >= np {
				return nil, fmt.Errorf("topic %s lists partition %d of %d", name, idx, np)
			}
			parts[idx] = PartitionMeta{Leader: leader, LeaderEpoch: epoch, Err: pcode}
		}
		r.int32() // topic authorized operations
		r.skipTags()
		if code != 0 {
			md.TopicErrors[name] = code
			continue
		}
		md.Topics[name] = parts
		md.TopicIDs[name] = FormatTopicID(id)
	}
	r.skipTags()
	if r.err != nil {
		return nil, r.err
	}
	return md, nil
}
