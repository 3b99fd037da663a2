package daemon

import (
	"testing"
	"time"
)

// TestProduceWaitCountsTheMember: while the destination does not answer
// the member, a partition with nothing in flight waits too, so describe
// shows its offsets stale instead of MIRRORING with a lag (issue 18).
func TestProduceWaitCountsTheMember(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name                     string
		member, sent, unanswered time.Time
		want                     int64
	}{
		{"nothing waits", time.Time{}, time.Time{}, time.Time{}, 0},
		{"its produce in flight", time.Time{}, now.Add(-3 * time.Second), time.Time{}, 3000},
		{"unanswered since before the resend", time.Time{}, now.Add(-time.Second), now.Add(-9 * time.Second), 9000},
		{"nothing in flight, the destination silent for the member", now.Add(-20 * time.Second), time.Time{}, time.Time{}, 20000},
		{"the longer of both", now.Add(-5 * time.Second), now.Add(-7 * time.Second), time.Time{}, 7000},
	} {
		if got := produceWaitMs(now, tc.member, tc.sent, tc.unanswered); got != tc.want {
			t.Errorf("%s: %d ms, want %d", tc.name, got, tc.want)
		}
	}
}
