package kwire

import (
	"context"
	"fmt"
	"io"
	"time"
)

// FetchPartition asks for one partition from Offset on.
type FetchPartition struct {
	Topic       string
	Partition   int32
	Offset      int64
	LeaderEpoch int32 // current leader epoch from metadata; -1 = unknown
	MaxBytes    int32
}

// FetchRequest is a multi-partition fetch to one broker.
type FetchRequest struct {
	MaxWait       time.Duration
	MinBytes      int32
	MaxBytes      int32
	ReadCommitted bool
	// Fetch session (KIP-227). SessionID 0 with SessionEpoch 0 asks the
	// broker to open a session; SessionEpoch -1 (the zero Request's
	// default via NoSession) fetches without one. In an incremental
	// request, Partitions lists only partitions added or changed, and
	// Forgotten those to drop from the session.
	SessionID    int32
	SessionEpoch int32
	Partitions   []FetchPartition // Fetch groups them by topic
	Forgotten    []TopicPartition
}

// NoSession is the session epoch of a fetch that neither opens nor uses a
// fetch session.
const NoSession int32 = -1

// TopicPartition names a partition.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Fetch-session errors: the broker lost or rejects the session; start a
// new one with a full fetch.
const (
	CodeFetchSessionIDNotFound   int16 = 70
	CodeInvalidFetchSessionEpoch int16 = 71
)

// FetchResponse is a parsed fetch response.
type FetchResponse struct {
	SessionID  int32
	Partitions []FetchedPartition
}

// AbortedTxn is one entry of a partition's aborted-transaction list.
type AbortedTxn struct {
	ProducerID  int64
	FirstOffset int64
}

// FetchedPartition is one partition of a fetch response. Records is a
// pooled buffer of its own (bufpool.go): FetchResponse.Release gives it
// back, or Detach hands it to the caller.
type FetchedPartition struct {
	Topic            string
	Partition        int32
	Err              int16
	HighWatermark    int64
	LastStableOffset int64
	LogStartOffset   int64
	Aborted          []AbortedTxn
	Records          []byte
}

// Fetch sends one sessionless Fetch (v11) and parses the response without
// decoding record batches.
func (c *Conn) Fetch(ctx context.Context, req *FetchRequest) ([]FetchedPartition, error) {
	r := *req
	r.SessionID, r.SessionEpoch, r.Forgotten = 0, NoSession, nil
	res, err := c.FetchSession(ctx, &r)
	if err != nil {
		return nil, err
	}
	return res.Partitions, nil
}

// FetchSession sends one Fetch (v11) with the request's session fields.
// A top-level error, such as a lost session, is returned as *Error. The
// answer must start within req.MaxWait + AnswerSlack and keep coming (no
// gap over AnswerSlack), or FetchSession fails with
// os.ErrDeadlineExceeded: a stalled source link is noticed as fast as the
// broker's own bound allows.
func (c *Conn) FetchSession(ctx context.Context, req *FetchRequest) (*FetchResponse, error) {
	w := c.header(apiFetch, fetchVersion)
	w.int32(-1) // replica ID: a consumer
	w.int32(int32(req.MaxWait / time.Millisecond))
	w.int32(req.MinBytes)
	w.int32(req.MaxBytes)
	if req.ReadCommitted {
		w.int8(1)
	} else {
		w.int8(0)
	}
	w.int32(req.SessionID)
	w.int32(req.SessionEpoch)
	groups := groupByTopic(len(req.Partitions), func(i int) string { return req.Partitions[i].Topic })
	w.int32(int32(len(groups)))
	for _, g := range groups {
		w.string(g.topic)
		w.int32(int32(len(g.idx)))
		for _, i := range g.idx {
			p := &req.Partitions[i]
			w.int32(p.Partition)
			w.int32(p.LeaderEpoch)
			w.int64(p.Offset)
			w.int64(-1) // log start offset: only followers send it
			w.int32(p.MaxBytes)
		}
	}
	fgroups := groupByTopic(len(req.Forgotten), func(i int) string { return req.Forgotten[i].Topic })
	w.int32(int32(len(fgroups)))
	for _, g := range fgroups {
		w.string(g.topic)
		w.int32(int32(len(g.idx)))
		for _, i := range g.idx {
			w.int32(req.Forgotten[i].Partition)
		}
	}
	w.string("") // rack ID
	// A zero max wait still bounds the answer (by AnswerSlack).
	var res *FetchResponse
	var perr error
	_, err := c.roundTripBy(ctx, w, time.Time{}, max(req.MaxWait, time.Millisecond), func(src io.Reader, n int) ([]byte, error) {
		sr := &streamReader{r: src, n: int64(n)}
		res, perr = readFetchResponse(sr, c.addr)
		return nil, sr.ioErr
	})
	if err != nil {
		res.Release()
		return nil, fmt.Errorf("fetch from %s: %w", c.addr, err)
	}
	if perr != nil {
		res.Release()
		return nil, perr
	}
	return res, nil
}

// Release gives every partition's record buffer not detached back for a
// later fetch to reuse: their Records (and anything sliced from them) are
// invalid after it. Without it the buffers are garbage-collected.
func (r *FetchResponse) Release() {
	if r == nil {
		return
	}
	for i := range r.Partitions {
		putBuf(r.Partitions[i].Records)
	}
	r.Partitions = nil
}

// Detach hands partition i's record buffer to the caller: Release leaves
// it alone, and the caller gives it back with ReleaseRecords once nothing
// uses any slice of it. It returns the records (nil when there are none).
func (r *FetchResponse) Detach(i int) []byte {
	b := r.Partitions[i].Records
	r.Partitions[i].Records = nil
	return b
}

// readFetchResponse reads a Fetch v11 response body from r, each
// partition's records straight into a pooled buffer of its own (no copy
// of the whole body first). It always reads the body to its end, so the
// connection stays in step: a top-level error comes back as *Error with
// the connection usable; a malformed body fails, and the caller must close
// the connection.
func readFetchResponse(r *streamReader, addr string) (*FetchResponse, error) {
	defer r.drain()
	r.int32() // throttle
	if code := r.int16(); code != 0 && r.err == nil {
		return nil, &Error{Code: code, Op: "fetch from " + addr}
	}
	res := &FetchResponse{SessionID: r.int32()}
	nt := r.arrayLen(6)
	for t := 0; t < nt && r.err == nil; t++ {
		topic := r.string()
		np := r.arrayLen(40)
		for p := 0; p < np && r.err == nil; p++ {
			fp := FetchedPartition{Topic: topic}
			fp.Partition = r.int32()
			fp.Err = r.int16()
			fp.HighWatermark = r.int64()
			fp.LastStableOffset = r.int64()
			fp.LogStartOffset = r.int64()
			if na := r.arrayLen(16); na > 0 {
				fp.Aborted = make([]AbortedTxn, na)
				for i := range fp.Aborted {
					fp.Aborted[i] = AbortedTxn{ProducerID: r.int64(), FirstOffset: r.int64()}
				}
			}
			r.int32() // preferred read replica
			fp.Records = r.records()
			res.Partitions = append(res.Partitions, fp)
		}
	}
	if r.err != nil {
		res.Release()
		return nil, fmt.Errorf("fetch response from %s: %w", addr, r.err)
	}
	return res, nil
}

type topicGroup struct {
	topic string
	idx   []int
}

// groupByTopic groups n items by topic, keeping first-seen order: Kafka
// expects each topic once per request.
func groupByTopic(n int, topic func(int) string) []topicGroup {
	var groups []topicGroup
	pos := map[string]int{}
	for i := 0; i < n; i++ {
		t := topic(i)
		g, ok := pos[t]
		if !ok {
			g = len(groups)
			pos[t] = g
			groups = append(groups, topicGroup{topic: t})
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	return groups
}
