package kwire

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go/compress"
)

// legacyEntry builds one v0/v1 message set entry as a broker stores it.
func legacyEntry(offset int64, magic, attrs int8, ts int64, key, value []byte) []byte {
	msg := []byte{0, 0, 0, 0, byte(magic), byte(attrs)}
	if magic == 1 {
		msg = binary.BigEndian.AppendUint64(msg, uint64(ts))
	}
	for _, b := range [][]byte{key, value} {
		if b == nil {
			msg = binary.BigEndian.AppendUint32(msg, 0xffffffff)
		} else {
			msg = binary.BigEndian.AppendUint32(msg, uint32(len(b)))
			msg = append(msg, b...)
		}
	}
	binary.BigEndian.PutUint32(msg, crc32.ChecksumIEEE(msg[4:]))
	out := binary.BigEndian.AppendUint64(nil, uint64(offset))
	out = binary.BigEndian.AppendUint32(out, uint32(len(msg)))
	return append(out, msg...)
}

// legacyWrapper compresses inner (entries) with codec into one wrapper
// message at offset.
func legacyWrapper(t *testing.T, offset int64, magic, codec int8, logAppend bool, ts int64, inner ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := compress.Compression(codec).Codec().NewWriter(&buf)
	for _, e := range inner {
		w.Write(e)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	attrs := codec
	if logAppend {
		attrs |= attrLogAppendTime
	}
	return legacyEntry(offset, magic, attrs, ts, nil, buf.Bytes())
}

// TestLegacyMessageSetsConvert: v0 and v1 message sets (Kafka before 0.11;
// a 2.x topic with message.format.version 0.10.2) read as v2 batches with
// the same offsets, keys, values and the timestamps a consumer of the
// source sees, compressed wrappers included (v1 inner offsets relative to
// the wrapper's last, v0 absolute), a compacted gap kept, a v2 batch after
// them read as before, and a partial message at the end asked for
// (issue 21: a 2.8 source's v1 data FAILED both partitions).
func TestLegacyMessageSetsConvert(t *testing.T) {
	k := func(s string) []byte { return []byte(s) }
	v2, err := EncodeBatch([]Record{{Timestamp: 9000, Key: k("v2"), Value: k("after upgrade")}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint64(v2[offBaseOffset:], 30)
	var set []byte
	add := func(b []byte) { set = append(set, b...) }
	// v0, uncompressed: no timestamps; a null key, an empty value.
	add(legacyEntry(0, 0, 0, 0, nil, k("a")))
	add(legacyEntry(1, 0, 0, 0, k("k1"), k("")))
	// v1 uncompressed, CreateTime; a compacted gap (3 is gone).
	add(legacyEntry(2, 1, 0, 1002, k("k2"), k("b")))
	add(legacyEntry(4, 1, 0, 1004, k("k4"), k("c")))
	// v0 gzip wrapper: inner offsets absolute, wrapper at the last.
	add(legacyWrapper(t, 6, 0, 1, false, 0, legacyEntry(5, 0, 0, 0, k("k5"), k("d")), legacyEntry(6, 0, 0, 0, k("k6"), k("e"))))
	// v1 snappy wrapper, CreateTime: inner offsets 0..2 relative, wrapper at 9.
	add(legacyWrapper(t, 9, 1, 2, false, 1009,
		legacyEntry(0, 1, 0, 1007, k("k7"), k("f")), legacyEntry(1, 1, 0, 1008, k("k8"), k("g")), legacyEntry(2, 1, 0, 1009, k("k9"), k("h"))))
	// v1 lz4 wrapper, LogAppendTime: every record gets the wrapper's time.
	add(legacyWrapper(t, 11, 1, 3, true, 5555, legacyEntry(0, 1, 0, 1, k("k10"), k("i")), legacyEntry(1, 1, 0, 2, k("k11"), k("j"))))
	add(v2)
	want := []Record{
		{Offset: 0, Timestamp: -1, Value: k("a")},
		{Offset: 1, Timestamp: -1, Key: k("k1"), Value: k("")},
		{Offset: 2, Timestamp: 1002, Key: k("k2"), Value: k("b")},
		{Offset: 4, Timestamp: 1004, Key: k("k4"), Value: k("c")},
		{Offset: 5, Timestamp: -1, Key: k("k5"), Value: k("d")},
		{Offset: 6, Timestamp: -1, Key: k("k6"), Value: k("e")},
		{Offset: 7, Timestamp: 1007, Key: k("k7"), Value: k("f")},
		{Offset: 8, Timestamp: 1008, Key: k("k8"), Value: k("g")},
		{Offset: 9, Timestamp: 1009, Key: k("k9"), Value: k("h")},
		{Offset: 10, Timestamp: 5555, Key: k("k10"), Value: k("i")},
		{Offset: 11, Timestamp: 5555, Key: k("k11"), Value: k("j")},
		{Offset: 30, Timestamp: 9000, Key: k("v2"), Value: k("after upgrade")},
	}
	// A partial legacy message at the end asks for its whole size.
	tail := legacyEntry(31, 1, 0, 1031, k("k31"), bytes.Repeat([]byte("x"), 100))
	input := append(append([]byte{}, set...), tail[:40]...)
	batches, need, err := SplitBatches(input)
	if err != nil {
		t.Fatal(err)
	}
	if need != len(tail) {
		t.Fatalf("a partial legacy message of %d bytes: need %d", len(tail), need)
	}
	var got []Record
	codecs := []int8{}
	for _, b := range batches {
		if b.ComputeCRC() != b.CRC() {
			t.Fatalf("%v: CRC-32C %#x, computed %#x", b, b.CRC(), b.ComputeCRC())
		}
		if b.BaseOffset() != 30 && (b.LeaderEpoch() != -1 || b.ProducerID() != -1 || b.IsLogAppendTime()) {
			t.Fatalf("%v: converted with leader epoch %d, producer %d, LogAppendTime %v; want -1, -1, CreateTime", b, b.LeaderEpoch(), b.ProducerID(), b.IsLogAppendTime())
		}
		if Aliases(input, b) != (b.BaseOffset() == 30) {
			t.Fatalf("%v: aliases the record set %v", b, Aliases(input, b))
		}
		recs, err := b.Records()
		if err != nil {
			t.Fatal(err)
		}
		if b.LastOffset() != recs[len(recs)-1].Offset {
			t.Fatalf("%v: last offset %d, last record %d", b, b.LastOffset(), recs[len(recs)-1].Offset)
		}
		got = append(got, recs...)
		codecs = append(codecs, b.Compression())
	}
	if len(got) != len(want) {
		t.Fatalf("%d records, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Offset != w.Offset || g.Timestamp != w.Timestamp || !bytes.Equal(g.Key, w.Key) || (g.Key == nil) != (w.Key == nil) ||
			!bytes.Equal(g.Value, w.Value) || (g.Value == nil) != (w.Value == nil) || len(g.Headers) != 0 {
			t.Fatalf("record %d: %+v, want %+v", i, g, w)
		}
	}
	if want := []int8{0, 1, 2, 3, 0}; !slicesEqual(codecs, want) {
		t.Fatalf("batch codecs %v, want %v (the uncompressed run, each wrapper's own, the v2 batch)", codecs, want)
	}
	if batches[0].Forwardable() {
		t.Fatalf("%v: a converted run with a compacted gap must be re-encoded, not forwarded", batches[0])
	}
	if !batches[2].Forwardable() {
		t.Fatalf("%v: a contiguous converted batch can be forwarded", batches[2])
	}
}

func slicesEqual(a, b []int8) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestLegacyMessageSetErrors: a corrupt legacy message is refused with its
// offset named, never converted.
func TestLegacyMessageSetErrors(t *testing.T) {
	good := legacyEntry(7, 1, 0, 1, []byte("k"), []byte("v"))
	corrupt := append([]byte{}, good...)
	corrupt[len(corrupt)-1] ^= 1
	short := append([]byte{}, good...)
	binary.BigEndian.PutUint32(short[offLength:], 3)
	nested := legacyWrapper(t, 9, 1, 1, false, 1, legacyWrapper(t, 0, 1, 1, false, 1, legacyEntry(0, 1, 0, 1, nil, []byte("x"))))
	for name, set := range map[string][]byte{"crc": corrupt, "size": short, "nested": nested} {
		if _, _, err := SplitBatches(set); err == nil || !strings.Contains(err.Error(), "offset") {
			t.Errorf("%s: %v, want an error naming the offset", name, err)
		}
	}
}
