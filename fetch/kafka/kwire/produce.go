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

// Produce sends one Produce (v8) with acks=all (-1) or the given acks and
// waits for its answer (SendProduce, then ReceiveProduce, under ctx).
// Kafka takes at most one batch per partition per request.
func (c *Conn) Produce(ctx context.Context, acks int16, timeout time.Duration, writeBy time.Time, parts []ProducePartition) ([]ProduceResult, error) {
	p, err := c.SendProduce(ctx, acks, timeout, writeBy, parts)
	if err != nil {
		return nil, err
	}
	return c.ReceiveProduce(ctx, p)
}

// PendingProduce is a produce request written to its connection whose
// answer has not been read yet (ReceiveProduce).
type PendingProduce struct {
	corr    int32
	timeout time.Duration
	// first: the connection's first request after ApiVersions (a broker
	// that closes the connection there is likely a SASL listener).
	first bool
}

// SendProduce writes one Produce (v8) with acks=all (-1) or the given acks
// and returns without waiting for the answer, which ReceiveProduce reads.
// Up to 5 requests may be pending on one connection: the broker handles
// them in order, and keeps the last 5 batches of an idempotent producer
// per partition to de-duplicate retries (max.in.flight.requests.per.connection,
// KIP-98). Only one goroutine may send at a time.
//
// writeBy, when not zero, is when the request must be written by (the
// sender's lease): a request not wholly written by then (or by ctx's
// deadline, or before ctx ends) fails with ErrNotSent and was not
// received by the broker; the connection must then be closed. timeout is
// the broker's own bound (ms on the wire) on waiting for the in-sync
// replicas.
func (c *Conn) SendProduce(ctx context.Context, acks int16, timeout time.Duration, writeBy time.Time, parts []ProducePartition) (PendingProduce, error) {
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
	if c.versions != nil {
		c.requests++
	}
	p := PendingProduce{corr: c.corr, timeout: timeout, first: c.versions != nil && c.requests == 1}
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultTimeout)
	}
	if !writeBy.IsZero() && writeBy.Before(dl) {
		dl = writeBy
	}
	c.nc.SetWriteDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.nc.SetWriteDeadline(time.Now()) })
	err := c.writeRequest(w)
	stop()
	if err != nil {
		return p, fmt.Errorf("produce to %s: %w", c.addr, err)
	}
	return p, nil
}

// ReceiveProduce reads the answer to p, which must be the oldest request
// pending on the connection. Its first byte must come within p's timeout
// + AnswerSlack, counted from now (an earlier request's answer came
// first) or from the end of a throttle an earlier answer asked for; each
// later read within AnswerSlack of the one before; all within ctx's
// deadline. Otherwise it fails with os.ErrDeadlineExceeded: the outcome
// is then unknown (the broker may have appended the batches), as it is
// for every request still pending behind p.
func (c *Conn) ReceiveProduce(ctx context.Context, p PendingProduce) ([]ProduceResult, error) {
	a := &answerReader{ctx: ctx, nc: c.nc, r: c.br}
	var ok bool
	if a.limit, ok = ctx.Deadline(); !ok {
		a.limit = time.Now().Add(defaultTimeout)
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetReadDeadline(time.Now()) })
	defer stop()
	// A throttle the broker asked for in an earlier answer mutes the
	// connection until it ends: p is handled only then.
	a.extend(p.timeout + AnswerSlack + max(time.Until(c.ThrottledUntil()), 0))
	body, err := c.readAnswer(a, p.corr, nil)
	if err != nil {
		if p.first {
			err = c.hintFirst(err)
		}
		return nil, fmt.Errorf("produce to %s: %w", c.addr, err)
	}
	res, throttle, err := parseProduceResponse(body, c.addr)
	if throttle > 0 {
		c.throttledUntil.Store(time.Now().Add(throttle).UnixNano())
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
