package fetch

import "testing"

// mirrorRun feeds a translation the source offsets that were mirrored, in
// order, and returns it with the expected answer for every source offset
// computed the slow way: the destination offset of the first mirrored
// record at or after it.
func mirrorRun(t *testing.T, start int64, mirrored []int64, srcEnd int64) (*Translation, map[int64]int64) {
	t.Helper()
	var tr Translation
	for i, src := range mirrored {
		tr.Observe(src, int64(i))
		tr.Advance(src+1, int64(i)+1)
	}
	tr.Advance(srcEnd, int64(len(mirrored)))
	want := map[int64]int64{}
	for o := start; o <= srcEnd; o++ {
		want[o] = int64(len(mirrored))
		for i, src := range mirrored {
			if src >= o {
				want[o] = int64(i)
				break
			}
		}
	}
	return &tr, want
}

func TestTranslateExact(t *testing.T) {
	cases := []struct {
		name     string
		start    int64
		mirrored []int64
		end      int64
		entries  int
	}{
		{"contiguous from zero", 0, []int64{0, 1, 2, 3, 4}, 5, 1},
		{"contiguous from an offset", 100, []int64{100, 101, 102}, 103, 1},
		{"aborted records in the middle", 0, []int64{0, 1, 5, 6, 7}, 8, 2},
		{"control marker after each batch", 0, []int64{0, 1, 3, 4, 6, 7}, 9, 3},
		{"compaction holes", 10, []int64{10, 12, 15, 16, 20}, 21, 4},
		{"trailing skipped records", 0, []int64{0, 1, 2}, 10, 1},
		{"leading skipped records", 0, []int64{4, 5, 6}, 7, 1},
		{"nothing mirrored yet", 7, nil, 9, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, want := mirrorRun(t, c.start, c.mirrored, c.end)
			if got := len(tr.Entries()); got != c.entries {
				t.Errorf("entries = %d (%v), want %d", got, tr.Entries(), c.entries)
			}
			for o := c.start; o <= c.end; o++ {
				got, ok := tr.Translate(o)
				if !ok || got != want[o] {
					t.Errorf("Translate(%d) = %d,%v want %d", o, got, ok, want[o])
				}
			}
			if _, ok := tr.Translate(c.end + 1); ok {
				t.Errorf("Translate beyond the mirrored position must not answer")
			}
		})
	}
}

func TestTranslateRestoreMatches(t *testing.T) {
	tr, want := mirrorRun(t, 0, []int64{0, 2, 3, 9, 10, 11, 30}, 31)
	var back Translation
	back.Restore(tr.Entries(), tr.End())
	for o := int64(0); o <= 31; o++ {
		if got, _ := back.Translate(o); got != want[o] {
			t.Fatalf("restored Translate(%d) = %d want %d", o, got, want[o])
		}
	}
}

// TestTailObservesLikeTheWhole: a confirm walk observes into the tail of a
// partition's translation; the breakpoints it finds must be those the
// whole translation would find.
func TestTailObservesLikeTheWhole(t *testing.T) {
	var whole Translation
	whole.Restore([]Entry{{0, 0}, {10, 8}}, Entry{Src: 20, Dst: 18})
	tail := whole.tail()
	for _, o := range []struct{ src, dst int64 }{{20, 18}, {21, 19}, {25, 20}, {26, 21}} {
		a, okA := whole.Observe(o.src, o.dst)
		b, okB := tail.Observe(o.src, o.dst)
		if a != b || okA != okB {
			t.Fatalf("observe %v: whole gave %v %v, tail %v %v", o, a, okA, b, okB)
		}
	}
	if len(whole.Entries()) != 3 {
		t.Fatalf("whole translation has %v, want one new breakpoint at 25", whole.Entries())
	}
}

// TestSeqBehind: which sequence ranges count as already used, with the
// wrap at 2^31 that Kafka's sequence numbers have.
func TestSeqBehind(t *testing.T) {
	const top = 1<<31 - 1
	cases := []struct {
		seq, next int32
		want      bool
	}{
		{0, 0, false},         // the expected batch
		{0, 10, true},         // an earlier batch
		{10, 0, false},        // ahead of the expected one
		{top - 5, 3, true},    // before the wrap
		{3, top - 5, false},   // after the wrap: ahead
		{0, 1 << 30, true},    // as far behind as counts
		{0, 1<<30 + 1, false}, // further is read as ahead
		{top, 0, true},        // the last sequence before the wrap
	}
	for _, c := range cases {
		if got := seqBehind(c.seq, c.next); got != c.want {
			t.Errorf("seqBehind(%d, %d) = %v, want %v", c.seq, c.next, got, c.want)
		}
	}
}

// segmentedRun builds a translation of n breakpoints, src 2i+1 -> dst i
// (a hole before every record), crossing several segments.
func segmentedRun(n int64) *Translation {
	var tr Translation
	for i := int64(0); i < n; i++ {
		tr.Observe(2*i+1, i)
	}
	tr.Advance(2*n+1, n)
	return &tr
}

func TestSegmentsRoundTrip(t *testing.T) {
	const n = 3*segEntries + 17
	tr := segmentedRun(n)
	segs, dropped := tr.takeUnsaved()
	if len(segs) != 4 || len(dropped) != 0 {
		t.Fatalf("%d segments, %d dropped; want 4 and none", len(segs), len(dropped))
	}
	var loaded []xlSeg
	for _, s := range segs {
		seg, err := segmentFromValue(s.value)
		if err != nil || seg.base != s.base {
			t.Fatalf("segment %d: %v (base %d)", s.base, err, seg.base)
		}
		loaded = append(loaded, seg)
	}
	var back Translation
	back.restoreSegments(loaded, nil, tr.End())
	for o := int64(0); o <= 2*n+1; o++ {
		a, _ := tr.Translate(o)
		b, _ := back.Translate(o)
		if a != b || a != o/2 {
			t.Fatalf("translate(%d): built %d, restored %d, want %d", o, a, b, o/2)
		}
	}
	if s, d := back.takeUnsaved(); len(s)+len(d) != 0 {
		t.Fatalf("a restored translation has %d unsaved segments and %d drops", len(s), len(d))
	}
	// Observing on continues the last segment under its base.
	back.Observe(2*n+3, n+1)
	s, _ := back.takeUnsaved()
	if len(s) != 1 || s[0].base != segs[3].base {
		t.Fatalf("after one more breakpoint: unsaved %v, want the last segment (base %d)", s, segs[3].base)
	}
}

// TestRestoreDropsBreakpointsPastTheCheckpoint: a segment written without
// its checkpoint holds breakpoints the walk observes again; they are cut
// so the walk appends them in order.
func TestRestoreDropsBreakpointsPastTheCheckpoint(t *testing.T) {
	tr := segmentedRun(segEntries + 10)
	segs, _ := tr.takeUnsaved()
	var loaded []xlSeg
	for _, s := range segs {
		seg, _ := segmentFromValue(s.value)
		loaded = append(loaded, seg)
	}
	cut := Entry{Src: 2*segEntries + 1, Dst: segEntries} // the checkpoint: the second segment's first entry is past it
	var back Translation
	back.restoreSegments(loaded, nil, cut)
	if back.Len() != segEntries {
		t.Fatalf("%d breakpoints after the cut, want %d", back.Len(), segEntries)
	}
	s, d := back.takeUnsaved()
	if len(s) != 0 || len(d) != 1 || d[0] != segs[1].base {
		t.Fatalf("unsaved %v, dropped %v: the emptied segment must be deleted", s, d)
	}
	if _, ok := back.Observe(cut.Src, cut.Dst); !ok {
		t.Fatal("the walk's first breakpoint after the checkpoint was not recorded")
	}
}

func TestTrimDropsSegmentsBelowLogStart(t *testing.T) {
	tr := segmentedRun(4 * segEntries)
	tr.takeUnsaved()
	bases := []int64{1, 2*segEntries + 1, 4*segEntries + 1, 6*segEntries + 1}
	tr.Trim(bases[2] - 1) // inside the second segment: only the first goes
	if _, d := tr.takeUnsaved(); len(d) != 1 || d[0] != bases[0] {
		t.Fatalf("dropped %v, want [%d]", d, bases[0])
	}
	tr.Trim(bases[3] + 5) // inside the last: all but it go
	if _, d := tr.takeUnsaved(); len(d) != 2 || d[0] != bases[1] || d[1] != bases[2] {
		t.Fatalf("dropped %v, want [%d %d]", d, bases[1], bases[2])
	}
	for _, o := range []int64{bases[3] + 5, 8*segEntries - 1} {
		if got, _ := tr.Translate(o); got != o/2 {
			t.Fatalf("translate(%d) after trimming = %d, want %d", o, got, o/2)
		}
	}
	tr.Trim(1 << 40) // the last segment always stays
	if tr.Len() != segEntries {
		t.Fatalf("%d breakpoints left, want the last segment's %d", tr.Len(), segEntries)
	}
}

func TestLegacyBreakpointsMoveToSegments(t *testing.T) {
	var back Translation
	back.restoreSegments(nil, []Entry{{10, 8}, {0, 0}, {30, 20}}, Entry{Src: 25, Dst: 18})
	if got := back.Entries(); len(got) != 2 || got[0] != (Entry{0, 0}) || got[1] != (Entry{10, 8}) {
		t.Fatalf("entries %v: legacy ones sorted, those past the checkpoint cut", got)
	}
	s, _ := back.takeUnsaved()
	if len(s) != 1 {
		t.Fatalf("legacy breakpoints must be written as a segment: %v", s)
	}
}

func TestDecodeSegmentRefusesGarbage(t *testing.T) {
	for _, b := range [][]byte{nil, {9, 1}, {segVersion, 0}, {segVersion, 2, 2, 2}, append(encodeSegment([]Entry{{1, 1}}), 0)} {
		if _, err := decodeSegment(b); err == nil {
			t.Errorf("decodeSegment(%v) accepted", b)
		}
	}
}

// TestLimitDropsOldestSegments: a transactional topic's breakpoints (one per
// commit marker) past SetLimit's bound drop the oldest segments, move the
// floor to the first one kept, mark them for deletion from the offsets
// topic, and keep every offset from the floor on exact; below the floor
// Translate answers nothing rather than the first kept breakpoint's guess.
func TestLimitDropsOldestSegments(t *testing.T) {
	// Every third source offset is a commit marker: a breakpoint each.
	var mirrored []int64
	for o := int64(0); o < 3*5*segEntries; o++ {
		if o%3 != 2 {
			mirrored = append(mirrored, o)
		}
	}
	tr, want := mirrorRun(t, 0, mirrored, 3*5*segEntries)
	full := tr.Bytes()
	open := tr.segs[len(tr.segs)-1].bytes() // decoded: the most of it
	limit := open + (full-open)/2           // about half the sealed segments
	tr.takeUnsaved()
	tr.SetLimit(limit)
	if tr.Floor() == 0 || tr.Bytes() > limit || len(tr.segs) < 2 {
		t.Fatalf("after SetLimit(%d): floor %d, %d bytes in %d segments (%d before)", limit, tr.Floor(), tr.Bytes(), len(tr.segs), full)
	}
	if first := tr.Entries()[0].Src; first != tr.Floor() {
		t.Fatalf("floor %d is not the first kept breakpoint %d", tr.Floor(), first)
	}
	_, dropped := tr.takeUnsaved()
	if len(dropped) == 0 || dropped[len(dropped)-1] >= tr.Floor() {
		t.Fatalf("dropped segment bases %v, floor %d", dropped, tr.Floor())
	}
	for o := int64(0); o <= 3*5*segEntries; o++ {
		got, ok := tr.Translate(o)
		if o < tr.Floor() {
			if ok {
				t.Fatalf("Translate(%d) below the floor %d = %d: it must not answer", o, tr.Floor(), got)
			}
			continue
		}
		if !ok || got != want[o] {
			t.Fatalf("Translate(%d) = %d,%v want %d (floor %d)", o, got, ok, want[o], tr.Floor())
		}
	}
	// Growing on: each sealed segment re-applies the bound.
	floor, n := tr.Floor(), int64(len(mirrored))
	end := tr.End()
	for i := int64(0); i < 16*segEntries; i++ { // sealed, about 2 KiB each: past the limit
		tr.Observe(end.Src+3*i, n+i)
		tr.Advance(end.Src+3*i+1, n+i+1)
	}
	if tr.Floor() <= floor || tr.Bytes() > limit+2*open {
		t.Fatalf("after more breakpoints: floor %d (was %d), %d bytes", tr.Floor(), floor, tr.Bytes())
	}
}

// TestLimitKeepsTheOpenSegment: a bound smaller than one segment keeps the
// segment being filled (Observe compares with its last entry).
func TestLimitKeepsTheOpenSegment(t *testing.T) {
	var tr Translation
	tr.SetLimit(1)
	for i := int64(0); i < 3*segEntries; i++ {
		tr.Observe(2*i, i)
	}
	tr.Advance(6*segEntries, 3*segEntries)
	if tr.Len() == 0 || tr.Len() > segEntries || tr.Floor() != 2*2*segEntries {
		t.Fatalf("%d breakpoints, floor %d; want the open segment from %d", tr.Len(), tr.Floor(), 4*segEntries)
	}
	if d, ok := tr.Translate(tr.Floor() + 2); !ok || d != 2*segEntries+1 {
		t.Fatalf("Translate(%d) = %d,%v", tr.Floor()+2, d, ok)
	}
}
