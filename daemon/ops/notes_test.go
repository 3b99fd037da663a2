package ops

import (
	"strings"
	"testing"
)

// TestVersionNotes: each feature an older broker lacks is named, and two
// clusters that have everything get no note.
func TestVersionNotes(t *testing.T) {
	v44 := map[int16]int16{keyListGroups: 5, keyConsumerGroupHeartbeat: 1, keyDescribeShareGroupOffsets: 1, keyAlterShareGroupOffsets: 0}
	v39 := map[int16]int16{keyListGroups: 5, keyConsumerGroupHeartbeat: 0, keyDescribeShareGroupOffsets: -1, keyAlterShareGroupOffsets: -1}
	v37 := map[int16]int16{keyListGroups: 4, keyConsumerGroupHeartbeat: -1, keyDescribeShareGroupOffsets: -1, keyAlterShareGroupOffsets: -1}
	v25 := map[int16]int16{keyListGroups: 3, keyConsumerGroupHeartbeat: -1, keyDescribeShareGroupOffsets: -1, keyAlterShareGroupOffsets: -1}
	for _, tc := range []struct {
		name     string
		src, dst map[int16]int16
		want     []string // one substring per note, in order
	}{
		{"4.4 into 4.4", v44, v44, nil},
		{"2.8 into 4.4", v37, v44, nil},
		{"4.4 into 3.9", v44, v39, []string{"share groups are not carried"}},
		{"4.4 into 3.7", v44, v37, []string{"ListGroups v4", "share groups are not carried", "no KIP-848 consumer groups"}},
		{"2.5 into 4.4", v25, v44, []string{"the source serves ListGroups up to v3"}},
		{"4.4 into 2.5", v44, v25, []string{"the destination serves ListGroups up to v3", "share groups", "KIP-848"}},
	} {
		got := versionNotes(tc.src, tc.dst)
		if len(got) != len(tc.want) {
			t.Errorf("%s: notes %q, want %d", tc.name, got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: note %d %q does not say %q", tc.name, i, got[i], w)
			}
		}
	}
}
