package integration

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kmirror/kmirror/integration/harness"
)

// requireCheckpointsForward reads every checkpoint record of the mirrored
// topic in kmirror's offsets topic on cl, in offset order, as a reader
// does: a record stamped with a lease generation lower than one already
// read for the partition is ignored (issue 19). What is left must never
// move a partition's checkpoint back: a checkpoint of an owner that lost
// its lease, landing after the next owner's, would. It returns how many
// stale records were ignored.
func requireCheckpointsForward(t *testing.T, cl *harness.Cluster, topic string) (stale int) {
	t.Helper()
	recs := readAll(t, cl, "__kmirror_offsets", 1, false)[0]
	type state struct {
		gen uint64
		src int64
	}
	last := map[string]*state{}
	n := 0
	for _, r := range recs {
		parts := strings.Split(string(r.Key), "\x00")
		if len(parts) != 4 || parts[0] != "ckpt" || parts[2] != topic || r.Value == nil {
			continue
		}
		var cp struct {
			Src int64 `json:"src"`
		}
		if err := json.Unmarshal(r.Value, &cp); err != nil {
			t.Fatalf("checkpoint %q at offset %d: %v", r.Key, r.Offset, err)
		}
		var gen uint64
		for _, h := range r.Headers {
			if h.Key == "kmirror.generation" && len(h.Value) == 8 {
				gen = binary.BigEndian.Uint64(h.Value)
			}
		}
		k := parts[1] + "/" + parts[2] + "/" + parts[3]
		s := last[k]
		if s == nil {
			s = &state{}
			last[k] = s
		}
		if gen != 0 && gen < s.gen {
			stale++
			continue
		}
		if cp.Src < s.src {
			t.Fatalf("%s: checkpoint at offset %d (generation %d) moves back from source offset %d to %d", k, r.Offset, gen, s.src, cp.Src)
		}
		s.gen, s.src = max(s.gen, gen), cp.Src
		n++
	}
	if n == 0 {
		t.Fatalf("no checkpoint of %s in the offsets topic", topic)
	}
	t.Logf("%s: %d checkpoints read in order, none moves back; %d of an older generation ignored", topic, n, stale)
	return stale
}
