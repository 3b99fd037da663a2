package owner

import (
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

func TestGroupNameConflict(t *testing.T) {
	for _, tc := range []struct {
		g        kwire.GroupListing
		exists   bool
		conflict bool
	}{
		{kwire.GroupListing{}, false, false},
		{kwire.GroupListing{ID: "g", ProtocolType: "consumer", State: "Empty", Type: "classic"}, true, false},
		{kwire.GroupListing{ID: "g", ProtocolType: "", State: "Empty", Type: "classic"}, true, false},
		{kwire.GroupListing{ID: "g", ProtocolType: "consumer", State: "Stable", Type: "consumer"}, true, false},
		{kwire.GroupListing{ID: "g", ProtocolType: "connect", State: "Empty", Type: "classic"}, true, true},
		{kwire.GroupListing{ID: "g", ProtocolType: "share", State: "Empty", Type: "share"}, true, true},
		{kwire.GroupListing{ID: "g", State: "Empty", Type: "streams"}, true, true},
	} {
		reason := groupNameConflict("g", tc.g, tc.exists)
		if (reason != "") != tc.conflict {
			t.Errorf("%+v: conflict reason %q, want conflict %t", tc.g, reason, tc.conflict)
		}
		if tc.conflict && !strings.Contains(reason, "group-name conflict") {
			t.Errorf("reason %q does not name the group-name conflict", reason)
		}
	}
}

// TestGroupAheadHasNoSyncLag: a group whose destination commit is ahead of
// the source's (left alone, as a conflict) waits for nothing, so its sync
// lag stays 0 instead of growing until an alert fires; a pending one's
// grows.
func TestGroupAheadHasNoSyncLag(t *testing.T) {
	g := &GroupSync{rows: map[groupRowKey]api.GroupStatus{}, final: map[groupRowKey]api.GroupStatus{},
		since: map[groupRowKey]seenCommit{}, conflicts: map[string]int64{}}
	ahead := api.GroupStatus{Mirror: "m", Group: "g", Topic: "t", Partition: 0, SourceCommitted: 1000, State: api.GroupConflict, Ahead: true}
	pending := api.GroupStatus{Mirror: "m", Group: "p", Topic: "t", Partition: 0, SourceCommitted: 1000, State: api.GroupPending}
	g.replaceRows("m", []api.GroupStatus{ahead, pending}, false)
	time.Sleep(20 * time.Millisecond)
	g.replaceRows("m", []api.GroupStatus{ahead, pending}, false)
	for _, r := range g.LiveRows() {
		switch r.Group {
		case "g":
			if r.SyncLagMs != 0 {
				t.Errorf("the group ahead on the destination shows a sync lag of %d ms", r.SyncLagMs)
			}
		case "p":
			if r.SyncLagMs < 20 {
				t.Errorf("the pending group shows a sync lag of %d ms, want at least 20", r.SyncLagMs)
			}
		}
	}
}
