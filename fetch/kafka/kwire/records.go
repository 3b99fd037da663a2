package kwire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/segmentio/kafka-go/compress"
)

// Header is one record header. A nil Value is a null header value.
type Header struct {
	Key   string
	Value []byte
}

// Record is one decoded record. Nil Key or Value means null; an empty
// non-nil slice means a zero-length value.
type Record struct {
	Offset    int64
	Timestamp int64
	Key       []byte
	Value     []byte
	Headers   []Header
}

// Records decodes the records of a data batch, decompressing if needed.
// Timestamps are the ones a consumer sees: the batch's max timestamp for
// LogAppendTime batches, the record's CreateTime otherwise.
func (b Batch) Records() ([]Record, error) {
	if b.IsControl() {
		return nil, nil
	}
	return b.decode()
}

// IsAbortMarker reads a control batch's marker record, whose key is
// version int16 then type int16 (0 = ABORT, 1 = COMMIT).
func (b Batch) IsAbortMarker() (bool, error) {
	recs, err := b.decode()
	if err != nil {
		return false, err
	}
	if len(recs) == 0 || len(recs[0].Key) < 4 {
		return false, fmt.Errorf("%v: control batch without a marker key", b)
	}
	return binary.BigEndian.Uint16(recs[0].Key[2:4]) == 0, nil
}

func (b Batch) decode() ([]Record, error) {
	data := b.records()
	if c := b.Compression(); c != 0 {
		codec := compress.Compression(c).Codec()
		if codec == nil {
			return nil, fmt.Errorf("%v: unknown compression codec %d", b, c)
		}
		rd := codec.NewReader(bytes.NewReader(data))
		plain, err := io.ReadAll(rd)
		rd.Close()
		if err != nil {
			return nil, fmt.Errorf("%v: decompress %s: %w", b, codec.Name(), err)
		}
		data = plain
	}
	n := int(b.RecordCount())
	if n < 0 || n > len(data) {
		return nil, fmt.Errorf("%v: record count %d does not fit %d bytes", b, n, len(data))
	}
	out := make([]Record, 0, n)
	base, firstTS := b.BaseOffset(), b.FirstTimestamp()
	logAppend := b.IsLogAppendTime()
	for i := 0; i < n; i++ {
		length, k := binary.Varint(data)
		if k <= 0 || length < 0 || int(length) > len(data)-k {
			return nil, fmt.Errorf("%v: record %d has a bad length", b, i)
		}
		rec, err := decodeRecord(data[k : k+int(length)])
		if err != nil {
			return nil, fmt.Errorf("%v: record %d: %w", b, i, err)
		}
		data = data[k+int(length):]
		rec.Offset += base
		if logAppend {
			rec.Timestamp = b.MaxTimestamp()
		} else {
			rec.Timestamp += firstTS
		}
		out = append(out, rec)
	}
	return out, nil
}

// decodeRecord decodes one record body; Offset and Timestamp hold deltas.
func decodeRecord(p []byte) (Record, error) {
	var r Record
	d := varReader{b: p}
	d.skip(1) // attributes: unused in v2
	r.Timestamp = d.varlong()
	r.Offset = d.varlong()
	r.Key = d.varBytes()
	r.Value = d.varBytes()
	nh := d.varlong()
	if nh < 0 || nh > int64(len(d.b)) {
		return r, fmt.Errorf("bad header count %d", nh)
	}
	if nh > 0 {
		r.Headers = make([]Header, nh)
		for i := range r.Headers {
			r.Headers[i].Key = string(d.varBytes())
			r.Headers[i].Value = d.varBytes()
		}
	}
	return r, d.err
}

type varReader struct {
	b   []byte
	err error
}

func (d *varReader) skip(n int) {
	if d.err == nil && len(d.b) < n {
		d.err = errShort
	}
	if d.err == nil {
		d.b = d.b[n:]
	}
}

func (d *varReader) varlong() int64 {
	if d.err != nil {
		return 0
	}
	v, k := binary.Varint(d.b)
	if k <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[k:]
	return v
}

func (d *varReader) varBytes() []byte {
	n := d.varlong()
	if d.err != nil || n < 0 {
		return nil
	}
	if int64(len(d.b)) < n {
		d.err = errShort
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

// EncodeBatch builds a CreateTime data batch of the given records (offset
// deltas 0..n-1 in the given order) compressed with codec. Producer fields
// are left for Rewrite. It is a pure function of its input, so the same
// records always give the same bytes: a re-encoded batch resent after a
// crash carries the same sequence range.
func EncodeBatch(records []Record, codec int8) (Batch, error) {
	return encodeBatch(records, codec, false)
}

// encodeBatch is EncodeBatch; with keepOffsets the batch's base offset is
// the first record's Offset and each offset delta the record's Offset less
// it (increasing, gaps allowed: a compacted legacy message set), and its
// leader epoch is -1 (unknown).
func encodeBatch(records []Record, codec int8, keepOffsets bool) (Batch, error) {
	if len(records) == 0 {
		return nil, fmt.Errorf("encode batch: no records")
	}
	firstTS, maxTS := records[0].Timestamp, records[0].Timestamp
	for _, r := range records {
		if r.Timestamp > maxTS {
			maxTS = r.Timestamp
		}
	}
	var body []byte
	var rec []byte
	for i, r := range records {
		rec = rec[:0]
		rec = append(rec, 0)
		rec = binary.AppendVarint(rec, r.Timestamp-firstTS)
		delta := int64(i)
		if keepOffsets {
			delta = r.Offset - records[0].Offset
		}
		rec = binary.AppendVarint(rec, delta)
		rec = appendVarBytes(rec, r.Key)
		rec = appendVarBytes(rec, r.Value)
		rec = binary.AppendVarint(rec, int64(len(r.Headers)))
		for _, h := range r.Headers {
			rec = binary.AppendVarint(rec, int64(len(h.Key)))
			rec = append(rec, h.Key...)
			rec = appendVarBytes(rec, h.Value)
		}
		body = binary.AppendVarint(body, int64(len(rec)))
		body = append(body, rec...)
	}
	if codec != 0 {
		c := compress.Compression(codec).Codec()
		if c == nil {
			return nil, fmt.Errorf("encode batch: unknown compression codec %d", codec)
		}
		var buf bytes.Buffer
		wr := c.NewWriter(&buf)
		if _, err := wr.Write(body); err != nil {
			return nil, fmt.Errorf("encode batch: %s: %w", c.Name(), err)
		}
		if err := wr.Close(); err != nil {
			return nil, fmt.Errorf("encode batch: %s: %w", c.Name(), err)
		}
		body = buf.Bytes()
	}
	b := make(Batch, batchHeaderSize, batchHeaderSize+len(body))
	binary.BigEndian.PutUint32(b[offLength:], uint32(batchHeaderSize-12+len(body)))
	b[offMagic] = 2
	binary.BigEndian.PutUint16(b[offAttributes:], uint16(codec))
	binary.BigEndian.PutUint32(b[offLastOffsetDelta:], uint32(len(records)-1))
	if keepOffsets {
		binary.BigEndian.PutUint64(b[offBaseOffset:], uint64(records[0].Offset))
		binary.BigEndian.PutUint32(b[offLeaderEpoch:], 0xffffffff)
		binary.BigEndian.PutUint32(b[offLastOffsetDelta:], uint32(records[len(records)-1].Offset-records[0].Offset))
	}
	binary.BigEndian.PutUint64(b[offFirstTimestamp:], uint64(firstTS))
	binary.BigEndian.PutUint64(b[offMaxTimestamp:], uint64(maxTS))
	binary.BigEndian.PutUint64(b[offProducerID:], ^uint64(0))
	binary.BigEndian.PutUint16(b[offProducerEpoch:], 0xffff)
	binary.BigEndian.PutUint32(b[offBaseSequence:], 0xffffffff)
	binary.BigEndian.PutUint32(b[offRecordCount:], uint32(len(records)))
	b = append(b, body...)
	binary.BigEndian.PutUint32(b[offCRC:], b.ComputeCRC())
	return b, nil
}

func appendVarBytes(b, p []byte) []byte {
	if p == nil {
		return binary.AppendVarint(b, -1)
	}
	b = binary.AppendVarint(b, int64(len(p)))
	return append(b, p...)
}
