package kwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// errShort reports a response that ended before a field it must contain.
var errShort = errors.New("kafka response truncated")

// writer appends big-endian Kafka primitives to a byte slice.
type writer struct {
	b []byte
	// refs are byte strings sent in place (bytesRef), each after b[:at]:
	// a produce request's batches go to the socket from where they lie
	// (writev) instead of being copied into b.
	refs []ref
}

type ref struct {
	at int
	p  []byte
}

// size is the request's length in bytes, refs included.
func (w *writer) size() int {
	n := len(w.b)
	for _, r := range w.refs {
		n += len(r.p)
	}
	return n
}

// buffers is the request as the socket takes it: b cut around refs.
func (w *writer) buffers() net.Buffers {
	bufs := make(net.Buffers, 0, 2*len(w.refs)+1)
	at := 0
	for _, r := range w.refs {
		bufs = append(bufs, w.b[at:r.at], r.p)
		at = r.at
	}
	return append(bufs, w.b[at:])
}

func (w *writer) int8(v int8)   { w.b = append(w.b, byte(v)) }
func (w *writer) int16(v int16) { w.b = binary.BigEndian.AppendUint16(w.b, uint16(v)) }
func (w *writer) int32(v int32) { w.b = binary.BigEndian.AppendUint32(w.b, uint32(v)) }
func (w *writer) int64(v int64) { w.b = binary.BigEndian.AppendUint64(w.b, uint64(v)) }

func (w *writer) string(s string) {
	w.int16(int16(len(s)))
	w.b = append(w.b, s...)
}

func (w *writer) nullString() { w.int16(-1) }

func (w *writer) bytes(p []byte) {
	w.int32(int32(len(p)))
	w.b = append(w.b, p...)
}

// bytesRef is bytes without the copy: p is written from where it lies and
// must not change until the request is written.
func (w *writer) bytesRef(p []byte) {
	w.int32(int32(len(p)))
	w.refs = append(w.refs, ref{at: len(w.b), p: p})
}

// reader consumes big-endian Kafka primitives; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) < n {
		r.err = errShort
		return false
	}
	return true
}

func (r *reader) int16() int16 {
	if !r.need(2) {
		return 0
	}
	v := int16(binary.BigEndian.Uint16(r.b))
	r.b = r.b[2:]
	return v
}

func (r *reader) int32() int32 {
	if !r.need(4) {
		return 0
	}
	v := int32(binary.BigEndian.Uint32(r.b))
	r.b = r.b[4:]
	return v
}

func (r *reader) int64() int64 {
	if !r.need(8) {
		return 0
	}
	v := int64(binary.BigEndian.Uint64(r.b))
	r.b = r.b[8:]
	return v
}

func (r *reader) string() string {
	n := int(r.int16())
	if n < 0 {
		return ""
	}
	if !r.need(n) {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// bytes returns a sub-slice of the response buffer (no copy), nil for null.
func (r *reader) bytes() []byte {
	n := int(r.int32())
	if n < 0 {
		return nil
	}
	if !r.need(n) {
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

// arrayLen reads an array length and checks it is plausible for the bytes
// left, so a corrupt length cannot make the caller allocate gigabytes.
func (r *reader) arrayLen(minElem int) int {
	n := int(r.int32())
	if n < 0 {
		return 0
	}
	if r.err == nil && n*minElem > len(r.b) {
		r.err = fmt.Errorf("kafka response array of %d elements does not fit in %d bytes", n, len(r.b))
		return 0
	}
	return n
}

// Flexible versions (KIP-482): unsigned varints, compact strings and
// arrays (length+1, 0 = null), tagged fields.

func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }

func (w *writer) compactString(s string) {
	w.uvarint(uint64(len(s)) + 1)
	w.b = append(w.b, s...)
}

func (r *reader) int8() int8 {
	if !r.need(1) {
		return 0
	}
	v := int8(r.b[0])
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int) {
	if r.need(n) {
		r.b = r.b[n:]
	}
}

// compactLen reads a compact array length (null reads as 0) and checks it
// is plausible for the bytes left.
func (r *reader) compactLen(minElem int) int {
	n := r.uvarint()
	if n == 0 || r.err != nil {
		return 0
	}
	if n-1 > uint64(len(r.b)/max(minElem, 1)) {
		r.err = fmt.Errorf("kafka response array of %d elements does not fit in %d bytes", n-1, len(r.b))
		return 0
	}
	return int(n - 1)
}

func (r *reader) compactString() string {
	n := r.compactLen(1)
	if !r.need(n) {
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// skipTags skips a tagged-field section.
func (r *reader) skipTags() {
	n := r.uvarint() // a plain count, not a compact length
	for i := uint64(0); i < n && r.err == nil; i++ {
		r.uvarint() // tag
		r.skip(int(r.uvarint()))
	}
}

// streamReader reads a response body field by field from the connection
// (n bytes of it left), for answers whose large fields go straight into
// buffers of their own (readFetchResponse). ioErr is a failed read (the
// connection is out of step); err is the first failure of either kind.
type streamReader struct {
	r       io.Reader
	n       int64
	err     error
	ioErr   error
	scratch [8]byte
}

func (r *streamReader) fixed(k int) []byte {
	if r.err != nil {
		return nil
	}
	if int64(k) > r.n {
		r.err = errShort
		return nil
	}
	if _, err := io.ReadFull(r.r, r.scratch[:k]); err != nil {
		r.err, r.ioErr = err, err
		return nil
	}
	r.n -= int64(k)
	return r.scratch[:k]
}

func (r *streamReader) int16() int16 {
	if b := r.fixed(2); b != nil {
		return int16(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (r *streamReader) int32() int32 {
	if b := r.fixed(4); b != nil {
		return int32(binary.BigEndian.Uint32(b))
	}
	return 0
}

func (r *streamReader) int64() int64 {
	if b := r.fixed(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

// take reads n bytes into a pooled buffer (bufpool.go).
func (r *streamReader) take(n int) []byte {
	if r.err != nil || n <= 0 {
		return nil
	}
	if int64(n) > r.n {
		r.err = errShort
		return nil
	}
	b := getBuf(n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		putBuf(b)
		r.err, r.ioErr = err, err
		return nil
	}
	r.n -= int64(n)
	return b
}

func (r *streamReader) string() string {
	n := int(r.int16())
	if n <= 0 {
		return ""
	}
	if r.err != nil {
		return ""
	}
	if int64(n) > r.n {
		r.err = errShort
		return ""
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r.r, b); err != nil {
		r.err, r.ioErr = err, err
		return ""
	}
	r.n -= int64(n)
	return string(b)
}

// records reads a nullable byte string into a pooled buffer of its own
// (nil for null or empty).
func (r *streamReader) records() []byte { return r.take(int(r.int32())) }

// arrayLen reads an array length and checks it is plausible for the bytes
// left, so a corrupt length cannot make the caller allocate gigabytes.
func (r *streamReader) arrayLen(minElem int) int {
	n := int(r.int32())
	if n < 0 {
		return 0
	}
	if r.err == nil && int64(n)*int64(minElem) > r.n {
		r.err = fmt.Errorf("kafka response array of %d elements does not fit in %d bytes", n, r.n)
		return 0
	}
	return n
}

// drain reads what is left of the body (fields a newer version adds, or
// the rest after a malformed field), keeping the connection in step.
func (r *streamReader) drain() {
	if r.ioErr != nil || r.n <= 0 {
		return
	}
	if _, err := io.CopyN(io.Discard, r.r, r.n); err != nil {
		r.ioErr = err
		if r.err == nil {
			r.err = err
		}
	}
	r.n = 0
}
