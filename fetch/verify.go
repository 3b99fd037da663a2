package fetch

import (
	"context"
	"fmt"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Verification (issue 22, section 4): the destination compared with the
// source record by record for offsets already mirrored, independently of
// the data path (it reads both clusters as a read_committed consumer does).
// Each committed source record maps to the next committed destination
// record, in order: kmirror copies every committed record once and nothing
// else, so a record missing, added, changed or deleted on the destination
// shows as the first pair that differs.

// VerifyResult is one partition's comparison.
type VerifyResult struct {
	// Compared counts the record pairs found equal; Bytes their source
	// records' keys, values and headers.
	Compared int64
	Bytes    int64
	// Mismatch describes the first pair that differs ("" when none), at
	// source offset MismatchSource and destination offset
	// MismatchDestination (-1 where that side had no record).
	Mismatch                            string
	MismatchSource, MismatchDestination int64
}

// VerifyRange compares the committed source records of topic/partition
// at offsets [srcFrom, srcTo) with the destination's committed records
// from dstFrom (the translation of srcFrom) on, pair by pair, and stops at
// the first that differs (key, value, headers, timestamp), or after limit
// pairs (0: no limit). Errors are failures to read either cluster; a
// difference is not an error.
func VerifyRange(ctx context.Context, src, dst *kafka.Admin, topic string, partition int32, srcFrom, srcTo, dstFrom, limit int64) (VerifyResult, error) {
	res := VerifyResult{MismatchSource: -1, MismatchDestination: -1}
	if srcFrom >= srcTo {
		return res, nil
	}
	var want []kwire.Record // source records not compared yet
	srcDone := false
	err := eachCommitted(ctx, dst, topic, partition, dstFrom, -1, func(got []kwire.Record) error {
		for _, d := range got {
			for len(want) == 0 && !srcDone {
				var err error
				if want, srcDone, err = nextSource(ctx, src, topic, partition, &srcFrom, srcTo); err != nil {
					return err
				}
			}
			if len(want) == 0 {
				return errStopRead // every mirrored source record matched
			}
			s := want[0]
			want = want[1:]
			if why := recordDiff(s, d); why != "" {
				res.Mismatch = fmt.Sprintf("source offset %d, destination offset %d: %s", s.Offset, d.Offset, why)
				res.MismatchSource, res.MismatchDestination = s.Offset, d.Offset
				return errStopRead
			}
			res.Compared++
			res.Bytes += recordBytes(s)
			if res.Compared == limit {
				return errStopRead
			}
		}
		return nil
	})
	if err != nil || res.Mismatch != "" || (limit > 0 && res.Compared == limit) {
		return res, err
	}
	for len(want) == 0 && !srcDone {
		if want, srcDone, err = nextSource(ctx, src, topic, partition, &srcFrom, srcTo); err != nil {
			return res, err
		}
	}
	if len(want) > 0 {
		res.Mismatch, res.MismatchSource = fmt.Sprintf("the destination ends before the copy of source offset %d", want[0].Offset), want[0].Offset
	}
	return res, nil
}

// recordBytes is a record's key, value and headers, in bytes.
func recordBytes(r kwire.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// verifyChunk bounds how many source records VerifyRange holds at once.
const verifyChunk = 4096

// nextSource reads the next committed source records from *from (at most
// verifyChunk, below to) and advances *from past them; done once to is
// reached.
func nextSource(ctx context.Context, src *kafka.Admin, topic string, partition int32, from *int64, to int64) ([]kwire.Record, bool, error) {
	var out []kwire.Record
	err := eachCommitted(ctx, src, topic, partition, *from, to, func(recs []kwire.Record) error {
		out = append(out, recs...)
		if len(out) >= verifyChunk {
			return errStopRead
		}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	if len(out) == 0 {
		*from = to
		return nil, true, nil
	}
	*from = out[len(out)-1].Offset + 1
	return out, *from >= to, nil
}
