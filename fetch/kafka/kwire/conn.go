package kwire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go/protocol"
)

// API keys kwire encodes itself.
const (
	apiProduce     int16 = 0
	apiFetch       int16 = 1
	apiApiVersions int16 = 18
)

// Versions kwire encodes for Fetch and Produce. Both are the newest
// non-flexible versions, accepted by Kafka 3.x and 4.x (KIP-896 removed only
// older ones).
const (
	fetchVersion   int16 = 11
	produceVersion int16 = 8
)

type versionRange struct{ min, max int16 }

// Conn is one connection to one broker. It is not safe for concurrent use,
// with one exception: produce requests may be pipelined, one goroutine
// sending them (SendProduce) while another reads their answers
// (ReceiveProduce); Kafka answers a connection's requests in the order
// sent. Abort may be called from any goroutine.
type Conn struct {
	addr string
	nc   net.Conn
	// tcp is the TCP connection under nc (nil when the dialer gave
	// another kind), for Abort and SetUserTimeout.
	tcp      *net.TCPConn
	br       *bufio.Reader
	clientID string
	corr     int32
	versions map[int16]versionRange
	wbuf     []byte
	small    int // requests in a row far smaller than wbuf
	// requests counts requests sent after ApiVersions (for the first one's
	// hint); sasl is set when the connection authenticates with SASL.
	requests int
	sasl     bool
	// throttledUntil is when the broker's last throttle_time_ms ends
	// (UnixNano; 0: none): it mutes the connection until then (KIP-219),
	// so nothing should be sent on it before. Written by the goroutine
	// that reads answers, read by the one that sends.
	throttledUntil atomic.Int64
}

// ThrottledUntil is when the throttle the broker last asked for on this
// connection ends (zero: none). Per KIP-219 a broker answers a request
// over quota at once, with throttle_time_ms, and then reads nothing from
// the connection for that long: a request sent meanwhile waits unread.
func (c *Conn) ThrottledUntil() time.Time {
	if n := c.throttledUntil.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Dial connects to addr, secures the connection as sec says (TLS
// handshake, then ApiVersions, then SASL), and checks that the broker
// supports the Fetch and Produce versions kwire speaks. A nil sec is
// PLAINTEXT. Certificate and credential failures wrap ErrAuthentication
// and say what to fix.
func Dial(ctx context.Context, addr, clientID string, sec *Security) (*Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect to kafka broker %s: %w", addr, err)
	}
	nc, err := secure(ctx, raw, addr, sec)
	if err != nil {
		raw.Close()
		return nil, err
	}
	c := &Conn{addr: addr, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), clientID: clientID}
	c.tcp, _ = raw.(*net.TCPConn)
	if err := c.negotiate(ctx); err != nil {
		nc.Close()
		return nil, explainFirstExchange(addr, sec, err)
	}
	c.sasl = sec != nil && sec.SASL != nil
	if err := c.authenticate(ctx, sec); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// Addr is the broker address the connection was dialled to.
func (c *Conn) Addr() string { return c.addr }

// MaxVersion is the newest version of API key the broker serves (from its
// ApiVersions answer), -1 when it serves none.
func (c *Conn) MaxVersion(key int16) int16 {
	if vr, ok := c.versions[key]; ok {
		return vr.max
	}
	return -1
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

func (c *Conn) negotiate(ctx context.Context) error {
	w := c.header(apiApiVersions, 0)
	body, err := c.roundTrip(ctx, w)
	if err != nil {
		return fmt.Errorf("ApiVersions to kafka broker %s: %w", c.addr, err)
	}
	r := reader{b: body}
	if code := r.int16(); code != 0 {
		return fmt.Errorf("ApiVersions to kafka broker %s: error code %d", c.addr, code)
	}
	n := r.arrayLen(6)
	c.versions = make(map[int16]versionRange, n)
	for i := 0; i < n; i++ {
		k, lo, hi := r.int16(), r.int16(), r.int16()
		c.versions[k] = versionRange{lo, hi}
	}
	if r.err != nil {
		return fmt.Errorf("ApiVersions from kafka broker %s: %w", c.addr, r.err)
	}
	for _, need := range []struct {
		key int16
		v   int16
	}{{apiFetch, fetchVersion}, {apiProduce, produceVersion}} {
		vr, ok := c.versions[need.key]
		if !ok {
			return fmt.Errorf("%s does not serve %s: it looks like a KRaft controller listener, which answers only controller requests; "+
				"point kmirror at a broker listener", c.addr, protocol.ApiKey(need.key))
		}
		if need.v < vr.min || need.v > vr.max {
			return fmt.Errorf("kafka broker %s does not support %s v%d (supports v%d..v%d): kmirror needs Kafka 2.6 or newer",
				c.addr, protocol.ApiKey(need.key), need.v, vr.min, vr.max)
		}
	}
	return nil
}

// header starts a request (header v1) in the connection's write buffer,
// leaving room for the size prefix.
func (c *Conn) header(apiKey, version int16) *writer {
	c.corr++
	w := &writer{b: c.wbuf[:0]}
	w.int32(0)
	w.int16(apiKey)
	w.int16(version)
	w.int32(c.corr)
	w.string(c.clientID)
	return w
}

// defaultTimeout bounds a request whose context has no deadline, so a
// broker that vanished without closing the connection cannot hang a caller.
const defaultTimeout = 2 * time.Minute

// deadline applies ctx to the connection: its deadline (or defaultTimeout),
// and cancellation, which unblocks a pending read or write at once. Call
// the returned function when the exchange is over.
func (c *Conn) deadline(ctx context.Context) (stop func() bool) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(defaultTimeout)
	}
	c.nc.SetDeadline(dl)
	return context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Now()) })
}

// maxKeptWriteBuffer is the largest request buffer a connection keeps for
// its next request.
const maxKeptWriteBuffer = 1 << 20

// shrinkAfter is how many small requests in a row drop a large buffer.
const shrinkAfter = 64

// roundTrip sends the request in w and returns the response body (after the
// correlation ID). The body is a fresh buffer the caller owns: fetched
// record batches are sub-slices of it.
func (c *Conn) roundTrip(ctx context.Context, w *writer) ([]byte, error) {
	return c.roundTripBy(ctx, w, time.Time{}, 0, nil)
}

// AnswerSlack is what a bounded request allows on top of the time the
// broker itself takes by the request (a produce's timeout, a fetch's max
// wait) for the first byte of its answer, and between two reads of the
// answer's body: a link that stalls (no RST, no FIN) is thus noticed
// within the broker's own bound plus AnswerSlack, not at the caller's
// outer deadline (issue 18: a held produce waited 12 s, a stalled fetch
// 30 s).
const AnswerSlack = time.Second

// answerReader reads an answer under a moving read deadline: extend sets
// it d from now, never beyond the context's deadline, and not at all once
// the context is done (its cancel has set the deadline to now). Every read
// that reaches the socket and returns bytes extends it by AnswerSlack; a
// read the bufio.Reader serves from its buffer leaves it alone (a fetch
// answer is read field by field, and setting a deadline per field cost
// 17 ms for one answer of 10,000 partitions: issue 20 review).
type answerReader struct {
	ctx   context.Context
	nc    net.Conn
	r     *bufio.Reader
	limit time.Time // the context's deadline; zero: none
}

func (a *answerReader) extend(d time.Duration) {
	if a.ctx.Err() != nil {
		return
	}
	dl := time.Now().Add(d)
	if !a.limit.IsZero() && a.limit.Before(dl) {
		dl = a.limit
	}
	a.nc.SetReadDeadline(dl)
}

func (a *answerReader) Read(b []byte) (int, error) {
	fromSocket := a.r.Buffered() == 0
	n, err := a.r.Read(b)
	if n > 0 && fromSocket {
		a.extend(AnswerSlack)
	}
	return n, err
}

// ErrNotSent wraps a failure to write a whole request: the broker never
// received all of it, so it cannot have acted on it. The connection must be
// closed (the broker drops the partial request with it).
var ErrNotSent = errors.New("request not sent")

// roundTripBy is roundTrip with the request's last byte written by writeBy
// at the latest (zero: ctx's deadline only); a request that cannot be
// written by then fails with ErrNotSent. When answerWithin is positive,
// the answer's first byte must come within answerWithin + AnswerSlack of
// the request's last byte written and each later read within AnswerSlack
// of the one before (within ctx's deadline throughout), or the round trip
// fails with os.ErrDeadlineExceeded. read, when set, reads the answer's
// body (else it is read into a new buffer).
func (c *Conn) roundTripBy(ctx context.Context, w *writer, writeBy time.Time, answerWithin time.Duration, read readBody) (body []byte, err error) {
	if c.versions != nil {
		c.requests++
		defer func() { err = c.firstRequestHint(err) }()
	}
	defer c.deadline(ctx)()
	if dl, ok := ctx.Deadline(); !writeBy.IsZero() && (!ok || writeBy.Before(dl)) {
		c.nc.SetWriteDeadline(writeBy)
	}
	if err := c.writeRequest(w); err != nil {
		return nil, err
	}
	var src io.Reader = c.br
	if answerWithin > 0 {
		a := &answerReader{ctx: ctx, nc: c.nc, r: c.br}
		a.limit, _ = ctx.Deadline()
		a.extend(answerWithin + AnswerSlack)
		src = a
	}
	return c.readAnswer(src, c.corr, read)
}

// writeRequest writes the request in w under the connection's current
// write deadline; a request not wholly written fails with ErrNotSent.
func (c *Conn) writeRequest(w *writer) error {
	reqSize := w.size()
	binary.BigEndian.PutUint32(w.b, uint32(reqSize-4))
	c.wbuf = w.b
	// A buffer grown for large produce requests is kept while they keep
	// coming, and dropped after shrinkAfter requests that used less than a
	// quarter of it, so an idle or trickling connection does not hold its
	// largest buffer forever (it is outside the memory budget).
	if cap(c.wbuf) > maxKeptWriteBuffer && len(w.b) < cap(c.wbuf)/4 {
		if c.small++; c.small >= shrinkAfter {
			defer func() { c.wbuf, c.small = nil, 0 }()
		}
	} else {
		c.small = 0
	}
	var n int64
	var err error
	if len(w.refs) == 0 {
		var m int
		m, err = c.nc.Write(w.b)
		n = int64(m)
	} else {
		bufs := w.buffers()
		n, err = bufs.WriteTo(c.nc)
	}
	if err != nil {
		return fmt.Errorf("%w: %d of %d bytes written to %s: %w", ErrNotSent, n, reqSize, c.addr, err)
	}
	return nil
}

// readAnswer reads one answer from src, which must carry correlation ID
// corr (Kafka answers a connection's requests in the order sent).
// readBody reads an answer's body of n bytes (after the correlation ID)
// from src, all of it, and returns what the caller gets as the body. An
// error fails the round trip; the connection is then out of step.
type readBody func(src io.Reader, n int) ([]byte, error)

func (c *Conn) readAnswer(src io.Reader, corr int32, read readBody) ([]byte, error) {
	var hdr [8]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		return nil, err
	}
	size := int32(binary.BigEndian.Uint32(hdr[:4]))
	got := int32(binary.BigEndian.Uint32(hdr[4:]))
	if string(hdr[:4]) == "HTTP" {
		return nil, fmt.Errorf("%s answered in HTTP, not the Kafka protocol: it is not a Kafka listener "+
			"(use a broker's host:port from its listeners or advertised.listeners)", c.addr)
	}
	if size < 4 || size > 1<<30 {
		return nil, fmt.Errorf("%s sent a response of %d bytes, which no Kafka broker sends: is it a Kafka listener?", c.addr, size)
	}
	if got != corr {
		return nil, fmt.Errorf("kafka broker %s answered correlation ID %d, expected %d", c.addr, got, corr)
	}
	if read != nil {
		return read(src, int(size)-4)
	}
	body := make([]byte, int(size)-4)
	if _, err := io.ReadFull(src, body); err != nil {
		return nil, err
	}
	return body, nil
}

// RoundTrip sends one of kafka-go's typed protocol messages at the newest
// version both sides support.
func (c *Conn) RoundTrip(ctx context.Context, msg protocol.Message) (protocol.Message, error) {
	key := msg.ApiKey()
	vr, ok := c.versions[int16(key)]
	if !ok {
		return nil, fmt.Errorf("kafka broker %s does not support %s", c.addr, key)
	}
	v := key.MaxVersion()
	if vr.max < v {
		v = vr.max
	}
	if v < vr.min || v < key.MinVersion() {
		return nil, fmt.Errorf("kafka broker %s supports %s v%d..v%d, kmirror speaks v%d..v%d",
			c.addr, key, vr.min, vr.max, key.MinVersion(), key.MaxVersion())
	}
	if p, ok := msg.(protocol.PreparedMessage); ok {
		p.Prepare(v)
	}
	defer c.deadline(ctx)()
	c.requests++
	c.corr++
	rw := struct {
		io.Reader
		io.Writer
	}{c.br, c.nc}
	res, err := protocol.RoundTrip(rw, v, c.corr, c.clientID, msg)
	return res, c.firstRequestHint(err)
}
