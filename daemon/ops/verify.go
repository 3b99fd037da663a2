package ops

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// Verify is kmirror verify (issue 22, section 4): for each MIRRORING
// partition of the topic, the destination is compared with the source
// record by record over the source offsets mirrored so far (from the
// source's log start, or where mirroring started, to the partition's
// mirrored position), through the exact translation. Full reads them all;
// sampled checks the first, the last and random offsets between
// (fetch.VerifyRange with one record each). Errors: ErrNotFound for an
// unknown mirror or topic, ErrInvalid for a bad request, ErrUnavailable
// when a cluster cannot be read; a mismatch is in the report.
func (o *Ops) Verify(ctx context.Context, req api.VerifyRequest) ([]api.VerifyPartition, error) {
	if req.Mirror == "" || req.Topic == "" {
		return nil, fmt.Errorf("%w: verify needs --mirror and --topic", api.ErrInvalid)
	}
	if req.Samples < 0 {
		return nil, fmt.Errorf("%w: samples %d: give a positive number, or leave it out for %d", api.ErrInvalid, req.Samples, api.DefaultVerifySamples)
	}
	samples := req.Samples
	if samples == 0 {
		samples = api.DefaultVerifySamples
	}
	if err := o.member.CaughtUp(ctx); err != nil {
		return nil, err
	}
	var mir *raftstore.Mirror
	var parts []raftstore.PartitionInfo
	o.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[req.Mirror]; ok {
			mir = m.Clone()
		}
		if t, ok := s.Topic(req.Mirror, req.Topic); ok {
			parts = slices.Clone(t.Partitions)
		}
	})
	if mir == nil || parts == nil {
		return nil, fmt.Errorf("%w: mirror %s has no topic %s (see kmirror describe)", api.ErrNotFound, req.Mirror, req.Topic)
	}
	rows, err := o.Describe(ctx, req.Mirror, req.Topic)
	if err != nil {
		return nil, err
	}
	src := o.member.SourceAdmin(*mir)
	defer src.Close()
	out := make([]api.VerifyPartition, len(parts))
	for i := range parts {
		out[i] = api.VerifyPartition{Partition: int32(i), From: -1, To: -1, MismatchSource: -1, MismatchDestination: -1}
	}
	compacted, err := CompactedReason(ctx, src, o.dest, req.Topic)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	if compacted != "" {
		for i := range out {
			out[i].Skipped = compacted
		}
		return out, nil
	}
	starts, err := src.Offsets(ctx, req.Topic, len(parts), kafka.Earliest)
	if err != nil {
		return nil, fmt.Errorf("%w: source log start offsets of %s: %v", api.ErrUnavailable, req.Topic, err)
	}
	dstStarts, err := o.dest.Offsets(ctx, req.Topic, len(parts), kafka.Earliest)
	if err != nil {
		return nil, fmt.Errorf("%w: destination log start offsets of %s: %v", api.ErrUnavailable, req.Topic, err)
	}
	for _, r := range rows {
		if r.Partition < 0 || int(r.Partition) >= len(parts) {
			continue
		}
		vp := &out[r.Partition]
		switch {
		case r.State != string(raftstore.StateMirroring):
			vp.Skipped = fmt.Sprintf("the partition is %s: verify compares partitions while they mirror", r.State)
			continue
		case r.SourceOffset < 0 || r.Lag < 0:
			vp.Skipped = "its mirrored position is not known right now (the partition is starting or moving): try again"
			continue
		}
		vp.From, vp.To = max(starts[r.Partition], parts[r.Partition].StartOffset), r.SourceOffset-r.Lag
		if vp.From >= vp.To {
			continue // nothing mirrored to compare
		}
		// Full: one pass from the start; sampled: one record at each offset.
		offsets, limit := []int64{vp.From}, int64(0)
		if !req.Full {
			offsets, limit = sampleOffsets(vp.From, vp.To, samples), 1
		}
		for _, s := range offsets {
			tr, err := o.Translate(ctx, req.Mirror, req.Topic, r.Partition, s)
			if err != nil {
				vp.Skipped = fmt.Sprintf("no translation of source offset %d: %v", s, err)
				break
			}
			if d, start := tr.DestinationOffset, dstStarts[r.Partition]; d < start {
				vp.Mismatch = fmt.Sprintf("source offset %d: its copy at destination offset %d is gone, the destination's log starts at %d "+
					"(records deleted there, by DeleteRecords or a shorter retention, while the source still holds them)", s, d, start)
				vp.MismatchSource, vp.MismatchDestination = s, d
				break
			}
			res, err := fetch.VerifyRange(ctx, src, o.dest, req.Topic, r.Partition, s, vp.To, tr.DestinationOffset, limit)
			if err != nil {
				return nil, fmt.Errorf("%w: verify %s/%d: %v", api.ErrUnavailable, req.Topic, r.Partition, err)
			}
			vp.Compared += res.Compared
			if res.Mismatch != "" {
				vp.Mismatch, vp.MismatchSource, vp.MismatchDestination = res.Mismatch, res.MismatchSource, res.MismatchDestination
				break
			}
		}
	}
	return out, nil
}

// sampleOffsets picks n source offsets in [from, to): the first, the last
// and random ones between, sorted, without repeats.
func sampleOffsets(from, to int64, n int) []int64 {
	seen := map[int64]bool{from: true, to - 1: true}
	for span := to - from; len(seen) < n && int64(len(seen)) < span; {
		seen[from+rand.Int64N(span)] = true
	}
	return slices.Sorted(maps.Keys(seen))
}

// CompactedReason says why topic cannot be verified record by record, ""
// when it can: its cleanup.policy on the source or the destination
// includes compact. Verification pairs the committed records of both
// sides in order (fetch.VerifyRange), and compaction on either side
// removes records after they were mirrored, on its own schedule, so the
// pairs would no longer line up and a correct copy would look different.
// Errors: either cluster's configs cannot be read.
func CompactedReason(ctx context.Context, src, dst *kafka.Admin, topic string) (string, error) {
	for _, c := range []struct {
		name string
		a    *kafka.Admin
	}{{"source", src}, {"destination", dst}} {
		cfg, err := c.a.TopicConfigs(ctx, topic)
		if err != nil {
			return "", err
		}
		if p := cfg["cleanup.policy"]; strings.Contains(p, "compact") {
			return fmt.Sprintf("compacted topic (cleanup.policy=%s on the %s): compaction removes records on each side on its own schedule, "+
				"so records cannot be paired in order; not verified", p, c.name), nil
		}
	}
	return "", nil
}
