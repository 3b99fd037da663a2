package truncate

import (
	"encoding/json"
	"testing"
)

func TestLastMirroredRoundTrip(t *testing.T) {
	rec := LastMirrored{Mirror: "m1", Topic: "orders", Partition: 3, SourceOffset: 120, DestinationOffset: 100, SourceLeaderEpoch: 4,
		SourceClusterID: "A", SourceTopicID: "tA", DestinationClusterID: "B", DestinationTopicID: "tB", StoppedAtMs: 1, Reason: "remove"}
	v, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	key := StateKey("m1", "orders", 3)
	if string(key) != "stopped\x00m1\x00orders\x003" {
		t.Fatalf("key %q", key)
	}
	got, ok, err := ParseLastMirrored(key, v)
	if err != nil || !ok || got != rec {
		t.Fatalf("parsed %+v, %t, %v; want %+v", got, ok, err, rec)
	}
	if _, ok, _ := ParseLastMirrored(key, nil); ok {
		t.Fatal("a tombstone parsed as a record")
	}
	if _, ok, _ := ParseLastMirrored([]byte("ckpt\x00m1\x00orders\x003"), v); ok {
		t.Fatal("another kind of record parsed as a last mirrored position")
	}
	if _, _, err := ParseLastMirrored(key, []byte("{")); err == nil {
		t.Fatal("a corrupt value parsed")
	}
}
