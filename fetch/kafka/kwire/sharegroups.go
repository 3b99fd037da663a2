package kwire

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Share group offsets (KIP-932; production-ready in Kafka 4.2): a share
// group's position on a partition is its share-partition start offset
// (SPSO), below which every record is acknowledged or archived. Both
// requests go to the group's coordinator, version 0, flexible.
const (
	apiDescribeShareGroupOffsets int16 = 90
	apiAlterShareGroupOffsets    int16 = 91
)

// ErrUnsupported wraps a call refused before anything was sent because
// the broker does not serve the request version kwire speaks (from its
// ApiVersions answer): retrying, or another connection, cannot help.
var ErrUnsupported = errors.New("not served by the broker")

// ErrNoShareGroups is returned by the share group calls of a broker that
// does not serve DescribeShareGroupOffsets and AlterShareGroupOffsets v0
// (Kafka before 4.1).
var ErrNoShareGroups = fmt.Errorf("%w: DescribeShareGroupOffsets/AlterShareGroupOffsets v0 (share groups need Kafka 4.2 or newer)", ErrUnsupported)

// SharePartitionOffset is one partition's answer: its SPSO (-1 when the
// group has no state for it) or the broker's error code.
type SharePartitionOffset struct {
	Topic       string
	Partition   int32
	StartOffset int64
	Code        int16
	Message     string
}

// ServesShareGroupOffsets reports whether the broker takes both requests
// at version 0.
func (c *Conn) ServesShareGroupOffsets() bool {
	for _, k := range []int16{apiDescribeShareGroupOffsets, apiAlterShareGroupOffsets} {
		if vr, ok := c.versions[k]; !ok || vr.min > 0 {
			return false
		}
	}
	return true
}

// DescribeShareGroupOffsets asks the coordinator for group's SPSO of the
// given partitions (topic -> partitions). groupCode is the group-level
// error code (GROUP_ID_NOT_FOUND for a group that does not exist, which
// the coordinator answers for a consumer group's name too).
func (c *Conn) DescribeShareGroupOffsets(ctx context.Context, group string, topics map[string][]int32) (out []SharePartitionOffset, groupCode int16, err error) {
	if !c.ServesShareGroupOffsets() {
		return nil, 0, fmt.Errorf("%s: %w", c.addr, ErrNoShareGroups)
	}
	w := c.header(apiDescribeShareGroupOffsets, 0)
	w.uvarint(0) // request header tagged fields
	w.uvarint(2) // one group
	w.compactString(group)
	names := slices.Sorted(maps.Keys(topics))
	w.uvarint(uint64(len(names) + 1))
	for _, t := range names {
		w.compactString(t)
		w.uvarint(uint64(len(topics[t]) + 1))
		for _, p := range topics[t] {
			w.int32(p)
		}
		w.uvarint(0)
	}
	w.uvarint(0) // group tags
	w.uvarint(0)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return nil, 0, fmt.Errorf("DescribeShareGroupOffsets to %s: %w", c.addr, err)
	}
	return parseDescribeShareGroupOffsets(body, c.addr)
}

func parseDescribeShareGroupOffsets(body []byte, addr string) (out []SharePartitionOffset, groupCode int16, err error) {
	r := reader{b: body}
	r.skipTags() // response header v1
	r.int32()    // throttle
	groups := r.compactLen(4)
	for g := 0; g < groups; g++ {
		r.compactString() // group ID
		topics := r.compactLen(4)
		for i := 0; i < topics; i++ {
			name := r.compactString()
			r.skip(16) // topic ID
			parts := r.compactLen(4)
			for j := 0; j < parts; j++ {
				p := SharePartitionOffset{Topic: name, Partition: r.int32(), StartOffset: r.int64()}
				r.int32() // leader epoch
				p.Code, p.Message = r.int16(), r.compactString()
				r.skipTags()
				out = append(out, p)
			}
			r.skipTags()
		}
		groupCode = r.int16()
		r.compactString()
		r.skipTags()
	}
	r.skipTags()
	if r.err != nil {
		return nil, 0, fmt.Errorf("DescribeShareGroupOffsets response from %s: %w", addr, r.err)
	}
	return out, groupCode, nil
}

// AlterShareGroupOffsets sets group's SPSO of the given partitions (topic
// -> partition -> offset); the coordinator refuses it while the group has
// members (NON_EMPTY_GROUP). It returns the top-level error code (from
// Kafka 4.4's response; 0 before) and each partition's.
func (c *Conn) AlterShareGroupOffsets(ctx context.Context, group string, offsets map[string]map[int32]int64) (code int16, parts []SharePartitionOffset, err error) {
	if !c.ServesShareGroupOffsets() {
		return 0, nil, fmt.Errorf("%s: %w", c.addr, ErrNoShareGroups)
	}
	w := c.header(apiAlterShareGroupOffsets, 0)
	w.uvarint(0)
	w.compactString(group)
	names := slices.Sorted(maps.Keys(offsets))
	w.uvarint(uint64(len(names) + 1))
	for _, t := range names {
		w.compactString(t)
		ps := slices.Sorted(maps.Keys(offsets[t]))
		w.uvarint(uint64(len(ps) + 1))
		for _, p := range ps {
			w.int32(p)
			w.int64(offsets[t][p])
			w.uvarint(0)
		}
		w.uvarint(0)
	}
	w.uvarint(0)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return 0, nil, fmt.Errorf("AlterShareGroupOffsets to %s: %w", c.addr, err)
	}
	return parseAlterShareGroupOffsets(body, c.addr)
}

// parseAlterShareGroupOffsets reads both layouts of version 0: Kafka 4.4's
// (throttle, error code, error message, responses) and the first one
// (throttle, responses), told apart by what follows the throttle.
func parseAlterShareGroupOffsets(body []byte, addr string) (code int16, out []SharePartitionOffset, err error) {
	for _, topLevel := range []bool{true, false} {
		r := reader{b: body}
		r.skipTags()
		r.int32()
		code = 0
		if topLevel {
			code = r.int16()
			r.compactString()
		}
		out = out[:0]
		topics := r.compactLen(4)
		for i := 0; i < topics; i++ {
			name := r.compactString()
			r.skip(16)
			parts := r.compactLen(4)
			for j := 0; j < parts; j++ {
				p := SharePartitionOffset{Topic: name, Partition: r.int32(), StartOffset: -1}
				p.Code, p.Message = r.int16(), r.compactString()
				r.skipTags()
				out = append(out, p)
			}
			r.skipTags()
		}
		r.skipTags()
		if r.err == nil && len(r.b) == 0 {
			return code, out, nil
		}
	}
	return 0, nil, fmt.Errorf("AlterShareGroupOffsets response from %s: %d bytes in neither known layout", addr, len(body))
}
