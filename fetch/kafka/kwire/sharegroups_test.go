package kwire

import (
	"reflect"
	"testing"
)

// TestParseShareGroupOffsets reads DescribeShareGroupOffsets v0 answers
// and both layouts of AlterShareGroupOffsets v0 (with Kafka 4.4's
// top-level error, and without), field by field as the schemas give them.
func TestParseShareGroupOffsets(t *testing.T) {
	w := &writer{}
	w.uvarint(0) // response header tags
	w.int32(0)   // throttle
	w.uvarint(2) // one group
	w.compactString("sg")
	w.uvarint(2) // one topic
	w.compactString("orders")
	w.b = append(w.b, make([]byte, 16)...)
	w.uvarint(3) // two partitions
	w.int32(0)
	w.int64(150)
	w.int32(3)
	w.int16(0)
	w.uvarint(0) // null message
	w.uvarint(0)
	w.int32(1)
	w.int64(-1)
	w.int32(3)
	w.int16(0)
	w.uvarint(0)
	w.uvarint(0)
	w.uvarint(0) // topic tags
	w.int16(0)   // group error
	w.uvarint(0)
	w.uvarint(0) // group tags
	w.uvarint(0)
	got, code, err := parseDescribeShareGroupOffsets(w.b, "b1")
	want := []SharePartitionOffset{{Topic: "orders", Partition: 0, StartOffset: 150}, {Topic: "orders", Partition: 1, StartOffset: -1}}
	if err != nil || code != 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("describe: %+v code %d err %v, want %+v", got, code, err, want)
	}

	for _, topLevel := range []bool{true, false} {
		w := &writer{}
		w.uvarint(0)
		w.int32(0)
		if topLevel {
			w.int16(0)
			w.uvarint(0)
		}
		w.uvarint(2)
		w.compactString("orders")
		w.b = append(w.b, make([]byte, 16)...)
		w.uvarint(2)
		w.int32(1)
		w.int16(CodeNonEmptyGroup)
		w.compactString("group is not empty")
		w.uvarint(0)
		w.uvarint(0)
		w.uvarint(0)
		code, parts, err := parseAlterShareGroupOffsets(w.b, "b1")
		want := []SharePartitionOffset{{Topic: "orders", Partition: 1, StartOffset: -1, Code: CodeNonEmptyGroup, Message: "group is not empty"}}
		if err != nil || code != 0 || !reflect.DeepEqual(parts, want) {
			t.Fatalf("alter (top-level error field %t): %+v code %d err %v, want %+v", topLevel, parts, code, err, want)
		}
	}
	// Kafka 4.4's layout with a top-level refusal and no partitions.
	w = &writer{}
	w.uvarint(0)
	w.int32(0)
	w.int16(CodeNonEmptyGroup)
	w.compactString("group is not empty")
	w.uvarint(1) // no topics
	w.uvarint(0)
	if code, parts, err := parseAlterShareGroupOffsets(w.b, "b1"); err != nil || code != CodeNonEmptyGroup || len(parts) != 0 {
		t.Fatalf("alter with a top-level error: code %d parts %+v err %v, want code %d and no partitions", code, parts, err, CodeNonEmptyGroup)
	}
	if _, _, err := parseAlterShareGroupOffsets([]byte{0, 0, 0}, "b1"); err == nil {
		t.Fatal("a truncated alter answer parsed")
	}
}
