package truncate

import (
	"testing"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
)

// TestPositionOfMapsThroughTheOldTranslation: a failback's destination A
// was the old mirror's source, with a compaction gap at offsets 50..59
// that its copy B closed (A 60 -> B 50). A group's position on A is given
// back as the B offset of the first mirrored record at or after it, and a
// position past the truncation point as the last mirrored position.
func TestPositionOfMapsThroughTheOldTranslation(t *testing.T) {
	aToB := []fetch.Entry{{Src: 0, Dst: 0}, {Src: 60, Dst: 50}}
	pp := PartitionPlan{Partition: 0, SourceOffset: 100, DestinationOffset: 110, DivergentFrom: 110, DestinationEnd: 130,
		Translation: swapped(aToB)}
	for _, tc := range []struct{ committed, kept, source int64 }{
		{0, 0, 0},
		{30, 30, 30},
		{55, 55, 50}, // inside the gap: the next record is A 60 = B 50
		{60, 60, 50},
		{70, 70, 60},
		{110, 110, 100},
		{125, 110, 100}, // past the truncation point: clamped
	} {
		gp := positionOf("g", pp, kafka.Committed{Offset: tc.committed, Metadata: "md"})
		if gp.Kept != tc.kept || gp.SourceOffset != tc.source || gp.Metadata != "md" || gp.Committed != tc.committed {
			t.Errorf("commit %d: kept %d source %d (%+v), want kept %d source %d", tc.committed, gp.Kept, gp.SourceOffset, gp, tc.kept, tc.source)
		}
	}
	// An unclean election moved the truncation point below the last
	// mirrored position: a commit past it keeps the point, mapped.
	pp.DivergentFrom = 80
	if gp := positionOf("g", pp, kafka.Committed{Offset: 100}); gp.Kept != 80 || gp.SourceOffset != 70 {
		t.Errorf("truncation point 80: kept %d source %d, want 80 and 70", gp.Kept, gp.SourceOffset)
	}
	// Below the old mirror's first copied record: not guessed either.
	late := pp
	late.Translation = swapped([]fetch.Entry{{Src: 63, Dst: 63}})
	late.DivergentFrom = 110
	if gp := positionOf("g", late, kafka.Committed{Offset: 52}); gp.SourceOffset != -1 || gp.Reason == "" {
		t.Errorf("below the translation's first entry: %+v, want source offset -1 and a reason", gp)
	}
	if gp := positionOf("g", late, kafka.Committed{Offset: 70}); gp.SourceOffset != 70 {
		t.Errorf("inside the translation: source offset %d, want 70", gp.SourceOffset)
	}
	// No translation below the last mirrored position: not guessed.
	pp.Translation = nil
	if gp := positionOf("g", pp, kafka.Committed{Offset: 40}); gp.SourceOffset != -1 || gp.Reason == "" {
		t.Errorf("without a translation: %+v, want source offset -1 and a reason", gp)
	}
}
