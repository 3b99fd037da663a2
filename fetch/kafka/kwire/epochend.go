package kwire

import (
	"context"
	"fmt"
)

const (
	apiOffsetForLeaderEpoch int16 = 23
	// offsetForLeaderEpochVersion is the newest non-flexible version (v3:
	// replica ID and current leader epoch); Kafka 4 removed only v0 and v1
	// (KIP-896).
	offsetForLeaderEpochVersion int16 = 3
	consumerReplicaID           int32 = -1
)

// EpochEnd is a partition's answer to OffsetForLeaderEpoch.
type EpochEnd struct {
	LeaderEpoch int32 // the largest epoch <= the one asked for; -1 unknown
	EndOffset   int64 // -1 unknown
}

// EpochEndOffset asks the partition's leader where leaderEpoch ends
// (OffsetForLeaderEpoch v3 as a consumer, KIP-320). currentLeaderEpoch
// fences stale metadata: the broker answers FENCED_LEADER_EPOCH or
// UNKNOWN_LEADER_EPOCH (returned as *Error) when it differs from its own.
//
// For the leader's current epoch the broker answers its log end offset,
// not the high watermark (LeaderEpochFileCache.endOffsetFor: "for the
// leader, the latest epoch is always the current leader epoch that is
// still being written to"), so asking with the current epoch twice tells
// the caller how far the leader's log reaches, committed or not.
func (c *Conn) EpochEndOffset(ctx context.Context, topic string, partition, currentLeaderEpoch, leaderEpoch int32) (EpochEnd, error) {
	vr, ok := c.versions[apiOffsetForLeaderEpoch]
	if !ok || offsetForLeaderEpochVersion < vr.min || offsetForLeaderEpochVersion > vr.max {
		return EpochEnd{}, fmt.Errorf("kafka broker %s does not support OffsetForLeaderEpoch v%d (supports v%d..v%d)",
			c.addr, offsetForLeaderEpochVersion, vr.min, vr.max)
	}
	w := c.header(apiOffsetForLeaderEpoch, offsetForLeaderEpochVersion)
	w.int32(consumerReplicaID)
	w.int32(1)
	w.string(topic)
	w.int32(1)
	w.int32(partition)
	w.int32(currentLeaderEpoch)
	w.int32(leaderEpoch)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return EpochEnd{}, fmt.Errorf("OffsetForLeaderEpoch to %s: %w", c.addr, err)
	}
	return parseEpochEnd(body, c.addr, topic, partition)
}

func parseEpochEnd(body []byte, addr, topic string, partition int32) (EpochEnd, error) {
	r := reader{b: body}
	r.int32() // throttle
	var out EpochEnd
	found := false
	nt := r.arrayLen(6)
	for t := 0; t < nt; t++ {
		name := r.string()
		np := r.arrayLen(18)
		for p := 0; p < np; p++ {
			code, part := r.int16(), r.int32()
			e := EpochEnd{LeaderEpoch: r.int32(), EndOffset: r.int64()}
			if name != topic || part != partition {
				continue
			}
			if code != CodeNone && r.err == nil {
				return EpochEnd{}, &Error{Code: code, Topic: topic, Partition: partition, Op: "OffsetForLeaderEpoch on " + addr}
			}
			out, found = e, true
		}
	}
	if r.err != nil {
		return EpochEnd{}, fmt.Errorf("OffsetForLeaderEpoch response from %s: %w", addr, r.err)
	}
	if !found {
		return EpochEnd{}, fmt.Errorf("OffsetForLeaderEpoch response from %s has no answer for %s/%d", addr, topic, partition)
	}
	return out, nil
}
