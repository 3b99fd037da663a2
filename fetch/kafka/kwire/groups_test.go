package kwire

import (
	"reflect"
	"testing"
)

func TestParseListGroups(t *testing.T) {
	var w writer
	w.uvarint(0) // response header tags
	w.int32(0)   // throttle
	w.int16(0)
	w.uvarint(3)
	for _, g := range []GroupListing{{"orders", "consumer", "Stable", "consumer"}, {"old", "", "Empty", "classic"}} {
		w.compactString(g.ID)
		w.compactString(g.ProtocolType)
		w.compactString(g.State)
		w.compactString(g.Type)
		w.uvarint(0)
	}
	w.uvarint(0)
	got, err := parseListGroups(w.b, 5, "b:9092")
	if err != nil {
		t.Fatal(err)
	}
	want := []GroupListing{{"orders", "consumer", "Stable", "consumer"}, {"old", "", "Empty", "classic"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	if _, err := parseListGroups(w.b[:len(w.b)-5], 5, "b:9092"); err == nil {
		t.Fatal("a truncated response parsed")
	}
	w.b[5], w.b[6] = 0, 31 // CLUSTER_AUTHORIZATION_FAILED
	if _, err := parseListGroups(w.b, 5, "b:9092"); err == nil {
		t.Fatal("an error code was ignored")
	}
}
