package ops

import (
	"testing"

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
