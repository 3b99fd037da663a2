package ops

import (
	"strings"
	"testing"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

func TestSummarise(t *testing.T) {
	m, st, f := raftstore.StateMirroring, raftstore.StateStopped, raftstore.StateFailed
	cases := []struct {
		states []raftstore.TopicState
		want   string
	}{
		{nil, "EMPTY"},
		{[]raftstore.TopicState{m, m}, "MIRRORING"},
		{[]raftstore.TopicState{m, st}, "MIRRORING"}, // a removed topic is not a problem of the mirror
		{[]raftstore.TopicState{st, st}, "STOPPED"},
		{[]raftstore.TopicState{m, f, st}, "FAILED"},
	}
	for _, c := range cases {
		if got := summarise(c.states); got != c.want {
			t.Errorf("summarise(%v) = %s, want %s", c.states, got, c.want)
		}
	}
}

func TestStaleness(t *testing.T) {
	for _, tc := range []struct {
		st   api.LiveStatus
		want string
	}{
		{api.LiveStatus{SourceAgeMs: 300}, ""},
		{api.LiveStatus{SourceAgeMs: 300, FetchWaitMs: 9000, ProduceWaitMs: 2000}, ""},
		{api.LiveStatus{SourceAgeMs: 26400, FetchWaitMs: 26000},
			"stale: source offset as of 26s ago: owner m2 has waited 26s for the source leader to answer a fetch, so the lag is unknown"},
		{api.LiveStatus{SourceAgeMs: -1, FetchWaitMs: 12000}, "stale: source offset never fetched: owner m2 has waited 12s"},
		{api.LiveStatus{SourceAgeMs: 100, ProduceWaitMs: 15000}, "stale: owner m2 has waited 15s for the destination to answer a produce"},
	} {
		got := staleness(tc.st, "m2")
		if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
			t.Errorf("staleness(%+v) = %q, want %q", tc.st, got, tc.want)
		}
	}
}
