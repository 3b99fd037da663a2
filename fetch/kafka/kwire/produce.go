package kwire

import (
	"context"
	"fmt"
	"time"
)

// ProducePartition is one batch for one partition.
type ProducePartition struct {
	Topic     string
	Partition int32
	Batch     Batch
}

// ProduceResult is one partition of a produce response.
type ProduceResult struct {
	Topic      string
	Partition  int32
	Err        int16
	BaseOffset int64
	Message    string // broker's error message, if any
}

// Produce sends one Produce (v8) with acks=all (-1) or the given acks.
// Kafka takes at most one batch per partition per request.
//
// writeBy, when not zero, is when the request must be written by (the
// sender's lease): a request not wholly written by then fails with
// ErrNotSent and was not received by the broker. timeout is the broker's
// own bound (ms on the wire) on waiting for the in-sync replicas; the
// answer must come within timeout + AnswerSlack of the request's last
// byte written, or Produce fails with os.ErrDeadlineExceeded (the
// outcome is then unknown: the broker may have appended the batches).
func (c *Conn) Produce(ctx context.Context, acks int16, timeout time.Duration, writeBy time.Time, parts []ProducePartition) ([]ProduceResult, error) {
	w := c.header(apiProduce, produceVersion)
	w.nullString() // transactional ID
	w.int16(acks)
	w.int32(int32(timeout / time.Millisecond))
	groups := groupByTopic(len(parts), func(i int) string { return parts[i].Topic })
	w.int32(int32(len(groups)))
	for _, g := range groups {
		w.string(g.topic)
		w.int32(int32(len(g.idx)))
		for _, i := range g.idx {
			w.int32(parts[i].Partition)
			w.bytesRef(parts[i].Batch)
		}
	}
	body, err := c.roundTripBy(ctx, w, writeBy, timeout, nil)
	if err != nil {
		return nil, fmt.Errorf("produce to %s: %w", c.addr, err)
	}
	res, throttle, err := parseProduceResponse(body, c.addr)
	if throttle > 0 {
		c.throttledUntil = time.Now().Add(throttle)
	}
	return res, err
}

// parseProduceResponse returns the partitions' results and the broker's
// throttle_time_ms.
func parseProduceResponse(body []byte, addr string) ([]ProduceResult, time.Duration, error) {
	r := reader{b: body}
	var out []ProduceResult
	nt := r.arrayLen(6)
	for t := 0; t < nt; t++ {
		topic := r.string()
		np := r.arrayLen(36)
		for p := 0; p < np; p++ {
			pr := ProduceResult{Topic: topic}
			pr.Partition = r.int32()
			pr.Err = r.int16()
			pr.BaseOffset = r.int64()
			r.int64() // log append time
			r.int64() // log start offset
			ne := r.arrayLen(6)
			for i := 0; i < ne; i++ {
				r.int32()
				if msg := r.string(); msg != "" && pr.Message == "" {
					pr.Message = msg
				}
			}
			if msg := r.string(); msg != "" {
				pr.Message = msg
			}
			out = append(out, pr)
		}
	}
	throttle := time.Duration(r.int32()) * time.Millisecond
	if r.err != nil {
		return nil, 0, fmt.Errorf("produce response from %s: %w", addr, r.err)
	}
	return out, throttle, nil
}
