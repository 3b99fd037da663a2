package kwire

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/compress"
	"github.com/segmentio/kafka-go/protocol"
)

var codecs = []struct {
	name string
	code int8
}{{"none", 0}, {"gzip", 1}, {"snappy", 2}, {"lz4", 3}, {"zstd", 4}}

func sampleRecords() []Record {
	return []Record{
		{Timestamp: 1700000000000, Key: []byte("k1"), Value: []byte("v1")},
		{Timestamp: 1700000000005, Key: nil, Value: []byte("null key")},
		{Timestamp: 1699999999000, Key: []byte("k3"), Value: nil},
		{Timestamp: 1700000000010, Key: []byte{}, Value: []byte{},
			Headers: []Header{{Key: "a", Value: []byte{0, 1}}, {Key: "a", Value: []byte("again")}, {Key: "n", Value: nil}}},
		{Timestamp: 1000000000000, Key: []byte{0xff}, Value: bytes.Repeat([]byte("x"), 10000)},
	}
}

// decodeWithKafkaGo reads a batch with kafka-go's decoder, which checks the
// CRC-32C and decompresses on its own: an independent check of our bytes.
func decodeWithKafkaGo(t *testing.T, b Batch) (*protocol.RecordBatch, []protocol.Record) {
	t.Helper()
	buf := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	buf = append(buf, b...)
	var rs protocol.RecordSet
	if _, err := rs.ReadFrom(bytes.NewBuffer(buf)); err != nil {
		t.Fatalf("kafka-go rejects the batch: %v", err)
	}
	stream, ok := rs.Records.(*protocol.RecordStream)
	if !ok || len(stream.Records) != 1 {
		t.Fatalf("kafka-go read %T, want one batch", rs.Records)
	}
	rb, ok := stream.Records[0].(*protocol.RecordBatch)
	if !ok {
		t.Fatalf("kafka-go read %T, want *protocol.RecordBatch", stream.Records[0])
	}
	var recs []protocol.Record
	for {
		r, err := rb.ReadRecord()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		cp := *r
		recs = append(recs, cp)
	}
	return rb, recs
}

func readBytes(t *testing.T, b protocol.Bytes) []byte {
	t.Helper()
	if b == nil {
		return nil
	}
	p, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEncodeRewriteDecodesWithKafkaGo(t *testing.T) {
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			want := sampleRecords()
			b, err := EncodeBatch(want, c.code)
			if err != nil {
				t.Fatal(err)
			}
			b.Rewrite(4242, 3, 77)
			if b.ComputeCRC() != b.CRC() {
				t.Fatal("CRC not updated")
			}
			rb, got := decodeWithKafkaGo(t, b)
			if rb.ProducerID != 4242 || rb.ProducerEpoch != 3 || rb.BaseSequence != 77 || rb.BaseOffset != 0 {
				t.Fatalf("producer fields = %d/%d/%d base %d", rb.ProducerID, rb.ProducerEpoch, rb.BaseSequence, rb.BaseOffset)
			}
			if int8(rb.Attributes.Compression()) != c.code || rb.Attributes.Transactional() {
				t.Fatalf("attributes = %#x", rb.Attributes)
			}
			if len(got) != len(want) {
				t.Fatalf("%d records, want %d", len(got), len(want))
			}
			for i, w := range want {
				g := got[i]
				if g.Offset != int64(i) || g.Time.UnixMilli() != w.Timestamp {
					t.Errorf("record %d: offset %d time %d", i, g.Offset, g.Time.UnixMilli())
				}
				if k := readBytes(t, g.Key); (k == nil) != (w.Key == nil) || !bytes.Equal(k, w.Key) {
					t.Errorf("record %d key %q want %q", i, k, w.Key)
				}
				if v := readBytes(t, g.Value); (v == nil) != (w.Value == nil) || !bytes.Equal(v, w.Value) {
					t.Errorf("record %d value differs", i)
				}
				if len(g.Headers) != len(w.Headers) {
					t.Fatalf("record %d: %d headers", i, len(g.Headers))
				}
				for j, h := range w.Headers {
					if g.Headers[j].Key != h.Key || !bytes.Equal(g.Headers[j].Value, h.Value) {
						t.Errorf("record %d header %d differs", i, j)
					}
				}
			}
		})
	}
}

// TestDecodeKafkaGoBatches checks our decoder against batches written by
// kafka-go's encoder, for every codec.
func TestDecodeKafkaGoBatches(t *testing.T) {
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			var in []protocol.Record
			for i, r := range sampleRecords() {
				pr := protocol.Record{Offset: int64(i), Time: time.UnixMilli(r.Timestamp)}
				if r.Key != nil {
					pr.Key = protocol.NewBytes(r.Key)
				}
				if r.Value != nil {
					pr.Value = protocol.NewBytes(r.Value)
				}
				for _, h := range r.Headers {
					pr.Headers = append(pr.Headers, protocol.Header{Key: h.Key, Value: h.Value})
				}
				in = append(in, pr)
			}
			rs := protocol.RecordSet{Version: 2, Attributes: protocol.Attributes(compress.Compression(c.code)),
				Records: protocol.NewRecordReader(in...)}
			var buf bytes.Buffer
			if _, err := rs.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			batches, need, err := SplitBatches(buf.Bytes()[4:])
			if err != nil || need != 0 || len(batches) != 1 {
				t.Fatalf("split: %d batches, need %d, err %v", len(batches), need, err)
			}
			got, err := batches[0].Records()
			if err != nil {
				t.Fatal(err)
			}
			want := sampleRecords()
			for i := range want {
				if got[i].Timestamp != want[i].Timestamp || !bytes.Equal(got[i].Key, want[i].Key) ||
					!bytes.Equal(got[i].Value, want[i].Value) || (got[i].Value == nil) != (want[i].Value == nil) {
					t.Errorf("record %d differs: %+v", i, got[i])
				}
			}
		})
	}
}

func TestRewriteClearsTransactionalBit(t *testing.T) {
	b, err := EncodeBatch(sampleRecords()[:2], 0)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint16(b[offAttributes:], uint16(b.Attributes()|attrTransactional))
	binary.BigEndian.PutUint32(b[offCRC:], b.ComputeCRC())
	if !b.IsTransactional() {
		t.Fatal("setup: not transactional")
	}
	b.Rewrite(9, 0, 0)
	if b.IsTransactional() {
		t.Fatal("transactional bit kept: the destination would hold an open transaction")
	}
	decodeWithKafkaGo(t, b)
}

func TestSplitBatches(t *testing.T) {
	b1, _ := EncodeBatch(sampleRecords()[:2], 0)
	b2, _ := EncodeBatch(sampleRecords()[2:], 3)
	set := append(append([]byte{}, b1...), b2...)
	cases := []struct {
		name    string
		set     []byte
		batches int
		need    int
		wantErr bool
	}{
		{"two whole batches", set, 2, 0, false},
		{"partial second batch", set[:len(b1)+100], 1, len(b2), false},
		{"partial header", set[:len(b1)+10], 1, batchHeaderSize, false},
		{"empty", nil, 0, 0, false},
		{"corrupt CRC", corrupt(set), 0, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			bs, need, err := SplitBatches(c.set)
			if (err != nil) != c.wantErr || len(bs) != c.batches || need != c.need {
				t.Fatalf("got %d batches need %d err %v", len(bs), need, err)
			}
		})
	}
}

func corrupt(set []byte) []byte {
	c := append([]byte{}, set...)
	c[len(c)/4] ^= 0xff
	return c
}

func TestNextSequenceWraps(t *testing.T) {
	cases := []struct{ seq, n, want int32 }{
		{0, 5, 5},
		{1<<31 - 3, 2, 1<<31 - 1},
		{1<<31 - 3, 3, 0},
		{1<<31 - 1, 10, 9},
	}
	for _, c := range cases {
		if got := NextSequence(c.seq, c.n); got != c.want {
			t.Errorf("NextSequence(%d,%d) = %d want %d", c.seq, c.n, got, c.want)
		}
	}
}
