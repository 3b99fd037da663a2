package ops

import (
	"strings"
	"testing"
)

// TestConfigChanges: a sync applies the source's changed values but the
// excluded ones, the deferred ones and an added compaction (held, with
// why).
func TestConfigChanges(t *testing.T) {
	want := map[string]string{"retention.ms": "5", "segment.ms": "9", "retention.bytes": "-1", "cleanup.policy": "compact", "max.message.bytes": "10"}
	have := map[string]string{"retention.ms": "4", "segment.ms": "8", "retention.bytes": "7", "cleanup.policy": "delete", "max.message.bytes": "10"}
	change, held := configChanges(want, have, []string{"segment.ms"}, map[string]string{"retention.bytes": "-1"})
	if len(change) != 1 || change["retention.ms"] != "5" || !strings.Contains(held, "compact") {
		t.Fatalf("changes %v, held %q: want only retention.ms=5, compaction held", change, held)
	}
	change, held = configChanges(map[string]string{"cleanup.policy": "delete"}, map[string]string{"cleanup.policy": "compact"}, nil, nil)
	if change["cleanup.policy"] != "delete" || held != "" {
		t.Fatalf("compaction dropped on the source: changes %v, held %q; want cleanup.policy=delete applied", change, held)
	}
}
