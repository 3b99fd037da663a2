package kwire

import (
	"context"
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
}

// Metadata asks the broker for the given topics (all topics if nil), fresh:
// never from a cache.
func (c *Conn) Metadata(ctx context.Context, topics []string) (*Metadata, error) {
	msg, err := c.RoundTrip(ctx, &metadata.Request{TopicNames: topics})
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", c.addr, err)
	}
	res := msg.(*metadata.Response)
	md := &Metadata{
		ClusterID:   res.ClusterID,
		Brokers:     make(map[int32]string, len(res.Brokers)),
		Topics:      make(map[string][]PartitionMeta, len(res.Topics)),
		TopicErrors: map[string]int16{},
	}
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
