package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ErrNoShareGroups: the cluster does not serve share group offsets
// (kwire.ErrNoShareGroups; Kafka before 4.1, production-ready from 4.2).
var ErrNoShareGroups = kwire.ErrNoShareGroups

// MaxVersions returns, per API key, the newest version every reachable
// broker of the cluster serves (-1: one serves none): during a rolling
// upgrade the older brokers decide. Brokers that cannot be reached are
// left out; none reachable is an error.
func (a *Admin) MaxVersions(ctx context.Context, keys ...int16) (map[int16]int16, error) {
	md, err := a.cl.Metadata(ctx, 0)
	if err != nil {
		return nil, err
	}
	var out map[int16]int16
	var lastErr error
	for _, addr := range md.Brokers {
		conn, err := a.cl.Borrow(ctx, addr)
		if err != nil {
			lastErr = err
			continue
		}
		if out == nil {
			out = make(map[int16]int16, len(keys))
			for _, k := range keys {
				out[k] = conn.MaxVersion(k)
			}
		}
		for _, k := range keys {
			out[k] = min(out[k], conn.MaxVersion(k))
		}
		a.cl.GiveBack(addr, conn)
	}
	if out == nil {
		return nil, fmt.Errorf("no broker of %s reachable for its API versions: %v", a.cl.Name, lastErr)
	}
	return out, nil
}

// ShareGroupOffsets returns a share group's share-partition start offsets
// (SPSO, KIP-932: every record below is acknowledged or archived) of the
// given partitions; a partition without state is left out, and a group
// that does not exist answers none. Errors: ErrNoShareGroups (wrapped)
// from a broker without the request; a *kwire.Error with the broker's
// code.
func (a *Admin) ShareGroupOffsets(ctx context.Context, group string, parts []TopicPartition) (map[TopicPartition]int64, error) {
	topics := map[string][]int32{}
	for _, tp := range parts {
		topics[tp.Topic] = append(topics[tp.Topic], tp.Partition)
	}
	var got []kwire.SharePartitionOffset
	var groupCode int16
	err := a.groupExchange(ctx, group, func(ctx context.Context, conn *kwire.Conn) (int16, error) {
		var err error
		got, groupCode, err = conn.DescribeShareGroupOffsets(ctx, group, topics)
		return groupCode, err
	})
	if err != nil {
		return nil, fmt.Errorf("share group offsets of %s on %s: %w", group, a.cl.Name, err)
	}
	switch groupCode {
	case kwire.CodeNone:
	case kwire.CodeGroupIDNotFound:
		return nil, nil
	default:
		return nil, &kwire.Error{Code: groupCode, Topic: group, Partition: -1, Op: "share group offsets on " + a.cl.Name}
	}
	out := map[TopicPartition]int64{}
	for _, p := range got {
		if p.Code != kwire.CodeNone {
			return nil, &kwire.Error{Code: p.Code, Topic: p.Topic, Partition: p.Partition, Op: "share group offset of " + group + " on " + a.cl.Name}
		}
		if p.StartOffset >= 0 {
			out[TopicPartition{p.Topic, p.Partition}] = p.StartOffset
		}
	}
	return out, nil
}

// AlterShareGroupOffsets sets a share group's SPSO of the given
// partitions. The coordinator refuses it while the group has members
// (NON_EMPTY_GROUP: IsGroupInUse). It returns each refused partition's
// error; a refusal of the whole request is the error.
func (a *Admin) AlterShareGroupOffsets(ctx context.Context, group string, offsets map[TopicPartition]int64) (map[TopicPartition]error, error) {
	byTopic := map[string]map[int32]int64{}
	for tp, o := range offsets {
		if byTopic[tp.Topic] == nil {
			byTopic[tp.Topic] = map[int32]int64{}
		}
		byTopic[tp.Topic][tp.Partition] = o
	}
	var code int16
	var parts []kwire.SharePartitionOffset
	err := a.groupExchange(ctx, group, func(ctx context.Context, conn *kwire.Conn) (int16, error) {
		var err error
		code, parts, err = conn.AlterShareGroupOffsets(ctx, group, byTopic)
		if err == nil && code == kwire.CodeNone {
			for _, p := range parts {
				if coordinatorMoved(p.Code) {
					return p.Code, nil
				}
			}
		}
		return code, err
	})
	if err != nil {
		return nil, fmt.Errorf("alter share group offsets of %s on %s: %w", group, a.cl.Name, err)
	}
	if code != kwire.CodeNone {
		return nil, &kwire.Error{Code: code, Topic: group, Partition: -1, Op: "alter share group offsets on " + a.cl.Name}
	}
	refused := map[TopicPartition]error{}
	for _, p := range parts {
		if p.Code != kwire.CodeNone {
			refused[TopicPartition{p.Topic, p.Partition}] = &kwire.Error{Code: p.Code, Topic: p.Topic, Partition: p.Partition,
				Op: "alter share group offset of " + group + " on " + a.cl.Name}
		}
	}
	return refused, nil
}

// IsNoShareGroups reports whether err says the cluster lacks share groups.
func IsNoShareGroups(err error) bool { return errors.Is(err, ErrNoShareGroups) }
