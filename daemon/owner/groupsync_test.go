package owner

import (
	"strings"
	"testing"

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
