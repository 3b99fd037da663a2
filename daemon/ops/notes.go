package ops

import (
	"context"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// What the Kafka versions of a mirror's two clusters turn off (issue 21,
// section 1): kmirror uses what each broker serves and names, per mirror,
// each protection or feature an older broker lacks, instead of a silent
// gap or a FAILED partition. The leader finds them from both clusters'
// ApiVersions in each config sync round; `kmirror list` shows them.

// API keys the notes look at (Kafka's protocol numbers).
const (
	keyListGroups                int16 = 16
	keyConsumerGroupHeartbeat    int16 = 68
	keyDescribeShareGroupOffsets int16 = 90
	keyAlterShareGroupOffsets    int16 = 91
)

// versionNotes says what the newest versions src and dst serve (API key
// -> version, -1 for none) turn off; none when nothing is.
func versionNotes(src, dst map[int16]int16) []string {
	var notes []string
	if v := src[keyListGroups]; v < 4 {
		notes = append(notes, fmt.Sprintf("group sync is off: the source serves ListGroups up to v%d, kmirror needs v4 (Kafka 2.6 or newer)", v))
	}
	if v := dst[keyListGroups]; v < 4 {
		notes = append(notes, fmt.Sprintf("group sync is off: the destination serves ListGroups up to v%d, kmirror needs v4 (Kafka 2.6 or newer)", v))
	} else if v < 5 {
		notes = append(notes, fmt.Sprintf("the destination's ListGroups v%d (before Kafka 3.8) gives no group type: a destination group of the "+
			"same name as a source group is told apart by its protocol type only (a streams group is not seen as a conflict)", v))
	}
	if src[keyDescribeShareGroupOffsets] >= 0 && (dst[keyDescribeShareGroupOffsets] < 0 || dst[keyAlterShareGroupOffsets] < 0) {
		notes = append(notes, "share groups are not carried: the destination has no AlterShareGroupOffsets (Kafka 4.2 or newer); "+
			"describe --groups names each one")
	}
	if src[keyConsumerGroupHeartbeat] >= 0 && dst[keyConsumerGroupHeartbeat] < 0 {
		notes = append(notes, "the destination has no KIP-848 consumer groups (ConsumerGroupHeartbeat): the offsets of the source's "+
			"KIP-848 groups are synced, and their consumers on the destination must use group.protocol=classic")
	}
	return notes
}

// recordNotes records mirror mir's version notes when they changed. A
// cluster that does not answer leaves the last ones.
func (o *Ops) recordNotes(ctx context.Context, mir *raftstore.Mirror, src *kafka.Admin) {
	keys := []int16{keyListGroups, keyConsumerGroupHeartbeat, keyDescribeShareGroupOffsets, keyAlterShareGroupOffsets}
	vctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	sv, err := src.MaxVersions(vctx, keys...)
	if err != nil {
		return
	}
	dv, err := o.dest.MaxVersions(vctx, keys...)
	if err != nil {
		return
	}
	notes := versionNotes(sv, dv)
	if slices.Equal(notes, mir.Notes) {
		return
	}
	if err := StoreErr(o.store.Apply(ctx, raftstore.SetMirrorNotes{Name: mir.Name, Notes: notes})); err != nil {
		o.log.Warn("record what the Kafka versions turn off", zap.String("mirror", mir.Name), zap.Error(err))
		return
	}
	for _, n := range notes {
		o.log.Warn("turned off by the Kafka versions", zap.String("mirror", mir.Name), zap.String("note", n))
	}
}
