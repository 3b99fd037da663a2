package ops

import (
	"testing"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestFillProgress: a partition behind gets its owner's time lag, rates,
// bytes left at the bytes per record mirrored so far and an ETA at its
// record rate; caught up (or STOPPED at its last position) all 0; an
// unknown lag keeps the time lag the owner knows (stale offsets during a
// destination outage: what a failover now would leave behind); a silent
// owner or an owner without the figures leaves them not known (-1), never
// 0, which would read as caught up.
func TestFillProgress(t *testing.T) {
	tl := func(ms int64) *int64 { return &ms }
	for _, tt := range []struct {
		name               string
		lag                int64
		st                 api.LiveStatus
		live               bool
		timeLag, left, eta int64
	}{
		{"behind", 1000, api.LiveStatus{TimeLagMs: tl(4200), MirroredRecords: 50, MirroredBytes: 5000, RecordsPerSec: 300}, true, 4200, 100_000, 4},
		{"behind, nothing mirrored yet", 1000, api.LiveStatus{TimeLagMs: tl(4200)}, true, 4200, -1, -1},
		{"behind, older owner", 1000, api.LiveStatus{MirroredRecords: 10, MirroredBytes: 10, RecordsPerSec: 1000}, true, -1, 1000, 1},
		{"caught up", 0, api.LiveStatus{TimeLagMs: tl(0), RecordsPerSec: 10}, true, 0, 0, 0},
		{"stopped at its last position", 0, api.LiveStatus{}, false, 0, 0, 0},
		// Offsets stale (the destination does not answer): the records
		// left are not known, the oldest unmirrored record's age is.
		{"lag not known", -1, api.LiveStatus{TimeLagMs: tl(4200), RecordsPerSec: 10}, true, 4200, -1, -1},
		{"lag not known, nothing fetched", -1, api.LiveStatus{TimeLagMs: tl(-1)}, true, -1, -1, -1},
		{"owner silent", 1000, api.LiveStatus{}, false, -1, -1, -1},
	} {
		ps := api.PartitionStatus{Lag: tt.lag}
		fillProgress(&ps, tt.st, tt.live)
		if ps.TimeLagMs != tt.timeLag || ps.BytesLeft != tt.left || ps.EtaSeconds != tt.eta {
			t.Errorf("%s: time lag %d, bytes left %d, ETA %d; want %d, %d, %d", tt.name, ps.TimeLagMs, ps.BytesLeft, ps.EtaSeconds, tt.timeLag, tt.left, tt.eta)
		}
		if tt.live && ps.RecordsPerSec != tt.st.RecordsPerSec {
			t.Errorf("%s: rate %v, want the owner's %v", tt.name, ps.RecordsPerSec, tt.st.RecordsPerSec)
		}
	}
}
