package truncate

import (
	"context"
	"fmt"
	"sort"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
)

// OffsetsTopic is kmirror's offsets topic (checkpoints and translation)
// on a group's destination cluster.
const OffsetsTopic = "__kmirror_offsets"

// Kinds of Plan.
const (
	// KindNew: the destination topic does not exist; it is created and
	// mirrored from the start.
	KindNew = "new"
	// KindRefused: add --dry-run found the topic cannot be added (Reason).
	KindRefused = "refused"
	// KindReAdd: the topic was mirrored in the same direction before and
	// removed (STOPPED); the destination topic is the one kmirror wrote.
	KindReAdd = "re-add"
	// KindFailback: the topic was mirrored the other way (the source of
	// this mirror was the destination of the other) and failed over; this
	// mirror brings it back.
	KindFailback = "failback"
)

// Side is one cluster as the plan sees it.
type Side struct {
	Admin     *kafka.Admin
	ClusterID string
}

// PartitionPlan says how one partition continues.
type PartitionPlan struct {
	Partition int32 `json:"partition"`
	// SourceOffset and DestinationOffset are where mirroring continues:
	// the destination records below DestinationOffset are the source's
	// records below SourceOffset.
	SourceOffset      int64 `json:"source_offset"`
	DestinationOffset int64 `json:"destination_offset"`
	// SourceLeaderEpoch is the source leader epoch of the last mirrored
	// batch when the source is the same as before (re-add); -1 for a
	// failback, whose source never had these records in its own epochs.
	SourceLeaderEpoch int32 `json:"source_leader_epoch"`
	// DestinationEnd is the destination partition's high watermark;
	// DivergentFrom the first destination offset that is not a copy of
	// the source: records in [DivergentFrom, DestinationEnd) were written
	// to the destination after the last mirrored position (or, with an
	// unclean leader election behind it, kept by a leader that had lost
	// what was mirrored). Divergent counts those offsets.
	DestinationEnd int64 `json:"destination_end"`
	DivergentFrom  int64 `json:"divergent_from"`
	Divergent      int64 `json:"divergent"`
	// Reason explains a divergence.
	Reason string `json:"reason,omitempty"`
	// Translation is the mapping below SourceOffset: source ->
	// destination breakpoints, seeded so groups translate exactly.
	Translation []fetch.Entry `json:"-"`
}

// Plan is what adding a topic whose destination topic already exists
// does: continue from the last mirrored position, or, where the
// destination has records past it, refuse or truncate.
type Plan struct {
	Mirror string `json:"mirror"`
	Topic  string `json:"topic"`
	Kind   string `json:"kind"`
	// From names the stopped mirror the positions come from.
	From string `json:"from,omitempty"`
	// Reason says why a KindRefused topic cannot be added.
	Reason     string          `json:"reason,omitempty"`
	Partitions []PartitionPlan `json:"partitions"`
	// Groups (add --dry-run of a divergent topic) are the destination
	// groups' positions --truncate would give back; GroupsNote says why
	// it would be refused now (groups with members) or why they could not
	// be read.
	Groups     []GroupPosition `json:"groups,omitempty"`
	GroupsNote string          `json:"groups_note,omitempty"`
}

// Divergent reports whether any partition has divergent records.
func (p *Plan) Divergent() bool {
	for _, pp := range p.Partitions {
		if pp.Divergent > 0 {
			return true
		}
	}
	return false
}

// DivergentRecords sums the divergent offsets of every partition.
func (p *Plan) DivergentRecords() int64 {
	var n int64
	for _, pp := range p.Partitions {
		n += pp.Divergent
	}
	return n
}

// Find looks for the last mirrored position of topic, whose destination
// topic exists, in both clusters' state topics:
//   - in the destination's, recorded by a mirror from the same source
//     cluster and source topic into this very destination topic (KindReAdd);
//   - in the source's, recorded by a mirror from this destination
//     cluster's topic into the source's topic (KindFailback).
//
// Where both are (a round trip), the latest stop wins. It returns nil when
// neither is there: the destination topic is not one kmirror wrote. Every
// partition must have a record.
func Find(ctx context.Context, mirror, topic string, src, dst Side) (*Plan, error) {
	srcMeta, err := src.Admin.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	dstMeta, err := dst.Admin.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	if srcMeta.Partitions != dstMeta.Partitions {
		return nil, nil
	}
	// Same direction: records on the destination.
	same, err := lastMirrored(ctx, dst.Admin, topic, func(r LastMirrored) bool {
		return r.SourceClusterID == src.ClusterID && r.SourceTopicID == srcMeta.ID &&
			(r.DestinationTopicID == "" || r.DestinationTopicID == dstMeta.ID)
	})
	if err != nil {
		return nil, err
	}
	// The other direction: records on the source, about this destination.
	back, err := lastMirrored(ctx, src.Admin, topic, func(r LastMirrored) bool {
		return r.SourceClusterID == dst.ClusterID && r.SourceTopicID == dstMeta.ID &&
			(r.DestinationTopicID == "" || r.DestinationTopicID == srcMeta.ID)
	})
	if err != nil {
		return nil, err
	}
	// After a round trip both exist: the latest stop is where the topic
	// was last mirrored from.
	useSame := len(same) == srcMeta.Partitions
	useBack := len(back) == srcMeta.Partitions
	if useSame && useBack {
		useSame = newest(same) >= newest(back)
		useBack = !useSame
	}
	switch {
	case useSame:
		return planFrom(ctx, mirror, topic, KindReAdd, same, src, dst, false)
	case useBack:
		return planFrom(ctx, mirror, topic, KindFailback, back, src, dst, true)
	}
	return nil, nil
}

// newest is the latest stop time of the records.
func newest(recs map[int32]LastMirrored) int64 {
	var t int64
	for _, r := range recs {
		t = max(t, r.StoppedAtMs)
	}
	return t
}

// lastMirrored returns the matching record of each partition of topic in
// a cluster's state topic; the newest wins where several mirrors left one.
func lastMirrored(ctx context.Context, a *kafka.Admin, topic string, match func(LastMirrored) bool) (map[int32]LastMirrored, error) {
	raw, err := fetch.StoppedRecords(ctx, a, StateTopic)
	if err != nil {
		return nil, err
	}
	out := map[int32]LastMirrored{}
	for k, v := range raw {
		if k.Topic != topic {
			continue
		}
		rec, ok, err := ParseLastMirrored(StateKey(k.Mirror, k.Topic, k.Partition), v)
		if err != nil || !ok || !match(rec) {
			continue
		}
		if old, ok := out[k.Partition]; !ok || rec.StoppedAtMs > old.StoppedAtMs {
			out[k.Partition] = rec
		}
	}
	return out, nil
}

// planFrom builds the plan from the records. swap is set for failback:
// the records' source is this mirror's destination.
func planFrom(ctx context.Context, mirror, topic, kind string, recs map[int32]LastMirrored, src, dst Side, swap bool) (*Plan, error) {
	n := len(recs)
	ends, err := dst.Admin.HighWatermarks(ctx, topic, n)
	if err != nil {
		return nil, err
	}
	// The old mirror's translation lives on its destination: this
	// mirror's destination for a re-add, its source for a failback.
	old := dst.Admin
	if swap {
		old = src.Admin
	}
	plan := &Plan{Mirror: mirror, Topic: topic, Kind: kind}
	for p := int32(0); p < int32(n); p++ {
		rec := recs[p]
		plan.From = rec.Mirror
		entries, _, _, err := fetch.TranslationOf(ctx, old, OffsetsTopic, fetch.Key{Mirror: rec.Mirror, Topic: topic, Partition: p})
		if err != nil {
			return nil, err
		}
		pp := PartitionPlan{Partition: p, SourceOffset: rec.SourceOffset, DestinationOffset: rec.DestinationOffset,
			SourceLeaderEpoch: rec.SourceLeaderEpoch, DestinationEnd: ends[p], DivergentFrom: rec.DestinationOffset, Translation: entries}
		// The side that was the old mirror's source may have lost
		// mirrored records in an unclean leader election: ask it where the
		// epoch of the last mirrored batch ends.
		oldSource, oldSourceEnd := src.Admin, rec.SourceOffset
		if swap {
			oldSource = dst.Admin
			pp.SourceOffset, pp.DestinationOffset, pp.DivergentFrom = rec.DestinationOffset, rec.SourceOffset, rec.SourceOffset
			pp.SourceLeaderEpoch = -1
			pp.Translation = swapped(entries)
		}
		if rec.SourceLeaderEpoch >= 0 {
			end, _, err := oldSource.EpochEnd(ctx, topic, p, rec.SourceLeaderEpoch)
			if err != nil {
				return nil, fmt.Errorf("leader epoch %d of %s/%d: %w", rec.SourceLeaderEpoch, topic, p, err)
			}
			if end >= 0 && end < oldSourceEnd {
				lost := fmt.Sprintf("the old source's leader epoch %d ends at offset %d, below the last mirrored offset %d: "+
					"it lost mirrored records in an unclean leader election and wrote others in their place", rec.SourceLeaderEpoch, end, oldSourceEnd)
				if swap {
					// This destination is that source: its records from
					// end on are not the ones mirrored.
					pp.DivergentFrom, pp.Reason = end, lost
				} else {
					// The source lost them: the destination holds copies
					// the source no longer has, from the translation of end.
					pp.DivergentFrom, pp.Reason = translate(entries, end, rec.SourceOffset, rec.DestinationOffset), lost
				}
			}
		}
		pp.Divergent = max(pp.DestinationEnd-pp.DivergentFrom, 0)
		if pp.Divergent > 0 && pp.Reason == "" {
			pp.Reason = fmt.Sprintf("destination %s written after the last mirrored position", OffsetRange(pp.DivergentFrom, pp.DestinationEnd))
		}
		plan.Partitions = append(plan.Partitions, pp)
	}
	return plan, nil
}

// swapped turns source -> destination breakpoints into destination ->
// source ones: every destination record below the last mirrored position
// is a copy of one source record, so the mapping inverts exactly.
func swapped(entries []fetch.Entry) []fetch.Entry {
	out := make([]fetch.Entry, len(entries))
	for i, e := range entries {
		out[i] = fetch.Entry{Src: e.Dst, Dst: e.Src}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Src < out[j].Src })
	return out
}

// translate maps source offset o below the end position (endSrc ->
// endDst) through breakpoints: the destination offset of the first
// mirrored record at or after o.
func translate(entries []fetch.Entry, o, endSrc, endDst int64) int64 {
	var xl fetch.Translation
	xl.Restore(entries, fetch.Entry{Src: endSrc, Dst: endDst})
	d, ok := xl.Translate(o)
	if !ok {
		return endDst
	}
	return d
}

// OffsetRange names offsets [from, to): "offset 7" or "offsets 7..9".
func OffsetRange(from, to int64) string {
	if to-from == 1 {
		return fmt.Sprintf("offset %d", from)
	}
	return fmt.Sprintf("offsets %d..%d", from, to-1)
}
