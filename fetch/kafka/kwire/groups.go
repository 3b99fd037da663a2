package kwire

import (
	"context"
	"fmt"
)

const (
	apiListGroups int16 = 16
	// listGroupsMinVersion is the first version that reports a group's
	// state (KIP-518, Kafka 2.6); v5 adds its type (classic, consumer,
	// share, streams: KIP-848).
	listGroupsMinVersion int16 = 4
	listGroupsMaxVersion int16 = 5
)

// GroupListing is one group as ListGroups reports it.
type GroupListing struct {
	ID string
	// ProtocolType is "consumer" for consumer groups (classic or KIP-848),
	// "" for a group that only holds committed offsets, "connect" for
	// Kafka Connect workers, ...
	ProtocolType string
	// State is the coordinator's state name: "Empty" means no members
	// (classic and KIP-848 groups alike).
	State string
	// Type is "classic", "consumer", "share" or "streams"; "" from brokers
	// older than ListGroups v5 (Kafka 3.8).
	Type string
}

// ListGroups lists the groups this broker coordinates (ListGroups v4 or v5,
// flexible versions). Every broker coordinates some groups: ask them all
// for the cluster's list.
func (c *Conn) ListGroups(ctx context.Context) ([]GroupListing, error) {
	vr, ok := c.versions[apiListGroups]
	v := min(vr.max, listGroupsMaxVersion)
	if !ok || v < listGroupsMinVersion || v < vr.min {
		return nil, fmt.Errorf("kafka broker %s does not support ListGroups v%d..v%d (supports v%d..v%d): kmirror needs Kafka 2.6 or newer to sync groups (%w)",
			c.addr, listGroupsMinVersion, listGroupsMaxVersion, vr.min, vr.max, ErrUnsupported)
	}
	w := c.header(apiListGroups, v)
	w.uvarint(0) // request header tagged fields
	w.uvarint(1) // states filter: empty array, all states
	if v >= 5 {
		w.uvarint(1) // types filter: empty array, all types
	}
	w.uvarint(0)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return nil, fmt.Errorf("ListGroups to %s: %w", c.addr, err)
	}
	return parseListGroups(body, v, c.addr)
}

func parseListGroups(body []byte, v int16, addr string) ([]GroupListing, error) {
	r := reader{b: body}
	r.skipTags() // response header v1
	r.int32()    // throttle
	code := r.int16()
	n := r.compactLen(4)
	out := make([]GroupListing, 0, n)
	for i := 0; i < n; i++ {
		g := GroupListing{ID: r.compactString(), ProtocolType: r.compactString(), State: r.compactString()}
		if v >= 5 {
			g.Type = r.compactString()
		}
		r.skipTags()
		out = append(out, g)
	}
	r.skipTags()
	if r.err != nil {
		return nil, fmt.Errorf("ListGroups response from %s: %w", addr, r.err)
	}
	if code != CodeNone {
		return nil, &Error{Code: code, Topic: "(groups)", Partition: -1, Op: "ListGroups on " + addr}
	}
	return out, nil
}
