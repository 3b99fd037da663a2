package fetch

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// mkBatch builds a source batch at base with n records from producer pid;
// kind is "data", "txn" (transactional data), "commit" or "abort" (control
// markers), "holes" (a compacted batch whose middle record is gone) or
// "logappend".
func mkBatch(t *testing.T, base, pid int64, kind string, n int) []byte {
	t.Helper()
	var recs []kwire.Record
	for i := 0; i < n; i++ {
		recs = append(recs, kwire.Record{Timestamp: 1000 + int64(i), Key: []byte(fmt.Sprintf("k%d", base+int64(i))), Value: []byte("v")})
	}
	var attrs uint16
	switch kind {
	case "txn":
		attrs = 0x10
	case "commit", "abort":
		typ := uint16(1)
		if kind == "abort" {
			typ = 0
		}
		recs = []kwire.Record{{Timestamp: 1000, Key: binary.BigEndian.AppendUint16([]byte{0, 0}, typ), Value: []byte{0, 0, 0, 0, 0, 0}}}
		attrs = 0x10 | 0x20
	case "logappend":
		attrs = 0x08
	}
	b, err := kwire.EncodeBatch(recs, 0)
	if err != nil {
		t.Fatal(err)
	}
	if kind == "holes" {
		// Rebuild as a batch with offset deltas 0 and 2 and lastOffsetDelta 2.
		b = holeBatch(t, recs)
	}
	binary.BigEndian.PutUint64(b[0:], uint64(base))
	binary.BigEndian.PutUint16(b[21:], binary.BigEndian.Uint16(b[21:])|attrs)
	binary.BigEndian.PutUint64(b[43:], uint64(pid))
	binary.BigEndian.PutUint32(b[17:], kwire.Batch(b).ComputeCRC())
	return b
}

// holeBatch re-encodes records keeping deltas 0 and 2 only, as log
// compaction leaves a batch.
func holeBatch(t *testing.T, recs []kwire.Record) []byte {
	t.Helper()
	b, err := kwire.EncodeBatch([]kwire.Record{recs[0], recs[2]}, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Patch the second record's offset delta (varint 1 -> 2) and the
	// batch's lastOffsetDelta; the record layout is length, attributes,
	// timestampDelta, offsetDelta.
	body := b[61:]
	l1, k := binary.Varint(body)
	second := body[k+int(l1):]
	_, k2 := binary.Varint(second)
	pos := k2 + 1
	_, k3 := binary.Varint(second[pos:])
	second[pos+k3] = 4 // zigzag varint of 2
	binary.BigEndian.PutUint32(b[23:], 2)
	return b
}

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

type wantItem struct {
	skip     bool
	srcFirst int64
	srcNext  int64
	offsets  []int64
}

func TestBuildItems(t *testing.T) {
	cases := []struct {
		name    string
		set     func(t *testing.T) []byte
		aborted []kwire.AbortedTxn
		from    int64
		want    []wantItem
		next    int64
	}{
		{
			name: "plain batches are forwarded one to one",
			set: func(t *testing.T) []byte {
				return concat(mkBatch(t, 0, -1, "data", 3), mkBatch(t, 3, -1, "data", 2))
			},
			want: []wantItem{{srcFirst: 0, srcNext: 3}, {srcFirst: 3, srcNext: 5}},
			next: 5,
		},
		{
			name: "committed transaction kept, markers skipped",
			set: func(t *testing.T) []byte {
				return concat(mkBatch(t, 0, 7, "txn", 2), mkBatch(t, 2, 7, "commit", 1), mkBatch(t, 3, -1, "data", 1))
			},
			want: []wantItem{{srcFirst: 0, srcNext: 2}, {skip: true, srcFirst: 2, srcNext: 3}, {srcFirst: 3, srcNext: 4}},
			next: 4,
		},
		{
			name: "aborted transaction interleaved with a committed one",
			set: func(t *testing.T) []byte {
				return concat(
					mkBatch(t, 0, 7, "txn", 2), // aborted
					mkBatch(t, 2, 8, "txn", 2), // committed
					mkBatch(t, 4, 7, "abort", 1),
					mkBatch(t, 5, 8, "commit", 1),
					mkBatch(t, 6, 7, "txn", 1), // a new transaction of 7, committed later
				)
			},
			aborted: []kwire.AbortedTxn{{ProducerID: 7, FirstOffset: 0}},
			want: []wantItem{
				{skip: true, srcFirst: 0, srcNext: 2},
				{srcFirst: 2, srcNext: 4},
				{skip: true, srcFirst: 4, srcNext: 6},
				{srcFirst: 6, srcNext: 7},
			},
			next: 7,
		},
		{
			name: "start inside a batch re-encodes its tail",
			set: func(t *testing.T) []byte {
				return mkBatch(t, 10, -1, "data", 4)
			},
			from: 12,
			want: []wantItem{{srcFirst: 12, srcNext: 14, offsets: []int64{12, 13}}},
			next: 14,
		},
		{
			name: "batches below the fetch offset are dropped",
			set: func(t *testing.T) []byte {
				return concat(mkBatch(t, 0, -1, "data", 2), mkBatch(t, 2, -1, "data", 2))
			},
			from: 2,
			want: []wantItem{{srcFirst: 2, srcNext: 4}},
			next: 4,
		},
		{
			name: "compaction holes are re-encoded contiguously",
			set: func(t *testing.T) []byte {
				return mkBatch(t, 20, -1, "holes", 3)
			},
			from: 20,
			want: []wantItem{{srcFirst: 20, srcNext: 23, offsets: []int64{20, 22}}},
			next: 23,
		},
		{
			name: "LogAppendTime batches are re-encoded",
			set: func(t *testing.T) []byte {
				return mkBatch(t, 0, -1, "logappend", 2)
			},
			want: []wantItem{{srcFirst: 0, srcNext: 2, offsets: []int64{0, 1}}},
			next: 2,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			items, next, need, err := buildItems(c.set(t), c.aborted, c.from)
			if err != nil || need != 0 {
				t.Fatalf("err %v need %d", err, need)
			}
			if next != c.next {
				t.Errorf("next = %d want %d", next, c.next)
			}
			if len(items) != len(c.want) {
				t.Fatalf("%d items want %d: %+v", len(items), len(c.want), items)
			}
			for i, w := range c.want {
				it := items[i]
				if it.skip() != w.skip || it.srcFirst != w.srcFirst || it.srcNext != w.srcNext {
					t.Errorf("item %d = skip %v %d..%d, want %+v", i, it.skip(), it.srcFirst, it.srcNext, w)
				}
				if it.skip() {
					continue
				}
				if it.batch.IsControl() || !it.batch.IsContiguous() || it.batch.IsLogAppendTime() {
					t.Errorf("item %d batch cannot be produced: %v", i, it.batch)
				}
				recs, err := it.records()
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range recs {
					wantOff := w.srcFirst + int64(j)
					if w.offsets != nil {
						wantOff = w.offsets[j]
					}
					if r.Offset != wantOff || string(r.Key) != fmt.Sprintf("k%d", wantOff) {
						t.Errorf("item %d record %d: offset %d key %s, want %d", i, j, r.Offset, r.Key, wantOff)
					}
				}
			}
		})
	}
}

// TestBuildItemsDeterministic: the same source bytes and start give the
// same destination bytes, which exact resume relies on.
func TestBuildItemsDeterministic(t *testing.T) {
	set := concat(mkBatch(t, 0, -1, "data", 4), mkBatch(t, 4, -1, "holes", 3))
	a, _, _, err := buildItems(append([]byte{}, set...), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	b, _, _, err := buildItems(append([]byte{}, set...), nil, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) || len(a) == 0 {
		t.Fatalf("two builds gave %d and %d items", len(a), len(b))
	}
	for i := range a {
		if string(a[i].batch) != string(b[i].batch) {
			t.Fatalf("item %d differs between two builds", i)
		}
	}
}

// Released record sets are poisoned in every test of the package: a batch
// that still aliased one would be produced as garbage, which the engine
// tests' record-by-record comparisons see.
func init() { poisonReleasedRecords = true }

// legacyV1 builds an uncompressed message format v1 entry (Kafka before
// 0.11) at offset.
func legacyV1(offset, ts int64, key, value string) []byte {
	msg := []byte{0, 0, 0, 0, 1, 0}
	msg = binary.BigEndian.AppendUint64(msg, uint64(ts))
	for _, b := range []string{key, value} {
		msg = binary.BigEndian.AppendUint32(msg, uint32(len(b)))
		msg = append(msg, b...)
	}
	binary.BigEndian.PutUint32(msg, crc32.ChecksumIEEE(msg[4:]))
	out := binary.BigEndian.AppendUint64(nil, uint64(offset))
	out = binary.BigEndian.AppendUint32(out, uint32(len(msg)))
	return append(out, msg...)
}

// TestBuildItemsConvertsLegacy: records of a legacy (v1) message set
// become items of their own buffers (owned: charged by size, never tied to
// the fetch's record set), marked converted so that they are counted when
// mirrored; a compacted gap is re-encoded with its source offsets; a v2
// batch after them still aliases the set; from inside the run drops the
// records below it.
func TestBuildItemsConvertsLegacy(t *testing.T) {
	var set []byte
	for _, o := range []int64{0, 1, 2, 4} {
		set = append(set, legacyV1(o, 1000+o, fmt.Sprintf("k%d", o), "v")...)
	}
	set = append(set, mkBatch(t, 5, -1, "data", 2)...)
	items, next, need, err := buildItems(set, nil, 1)
	if err != nil || need != 0 || next != 7 {
		t.Fatalf("next %d need %d err %v, want 7 0 nil", next, need, err)
	}
	if len(items) != 2 {
		t.Fatalf("%d items, want 2 (the converted run, the v2 batch)", len(items))
	}
	conv, v2 := items[0], items[1]
	if !conv.converted || !conv.owned || conv.buf != nil || kwire.Aliases(set, conv.batch) {
		t.Fatalf("converted item: converted %v owned %v", conv.converted, conv.owned)
	}
	if want := []int64{1, 2, 4}; conv.count != 3 || fmt.Sprint(conv.srcOffsets) != fmt.Sprint(want) || conv.srcNext != 5 {
		t.Fatalf("converted item: %d records at %v up to %d, want 3 at %v up to 5", conv.count, conv.srcOffsets, conv.srcNext, want)
	}
	recs, err := conv.records()
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		if o := []int64{1, 2, 4}[i]; r.Offset != o || r.Timestamp != 1000+o || string(r.Key) != fmt.Sprintf("k%d", o) || string(r.Value) != "v" {
			t.Fatalf("converted record %d: %+v", i, r)
		}
	}
	if v2.converted || v2.owned || !kwire.Aliases(set, v2.batch) {
		t.Fatalf("v2 item after the legacy run: converted %v owned %v aliases %v", v2.converted, v2.owned, kwire.Aliases(set, v2.batch))
	}
	p := &partition{}
	p.ack(conv, 0)
	p.ack(v2, 3)
	if p.convertedRecords != 3 {
		t.Fatalf("%d converted records counted, want 3", p.convertedRecords)
	}
}
