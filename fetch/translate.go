package fetch

import "sort"

// Entry is one breakpoint of the offset-translation log: from source offset
// Src on, mirrored records sit at Dst + (src - Src) until the next entry.
type Entry struct {
	Src int64
	Dst int64
}

// Translation is the exact source -> destination offset map of one
// partition (design.md section 5). Entries are needed only where the
// mapping breaks (skipped aborted or control records, compaction holes, the
// start offset); with no gaps a partition has one entry.
type Translation struct {
	entries []Entry
	// end is the mirrored position: every source offset below end.Src has
	// been decided (mirrored or skipped), and end.Dst is the next
	// destination offset.
	end Entry
}

// Observe records that the source record at src was mirrored to dst. It
// returns the new breakpoint when the mapping broke at src, for the caller
// to persist.
func (t *Translation) Observe(src, dst int64) (Entry, bool) {
	if n := len(t.entries); n > 0 {
		last := t.entries[n-1]
		// Gaps only ever lower dst-src, so comparing with the last entry
		// is enough to know whether the mapping broke.
		if src-last.Src == dst-last.Dst {
			return Entry{}, false
		}
	}
	e := Entry{Src: src, Dst: dst}
	t.entries = append(t.entries, e)
	return e, true
}

// Advance moves the mirrored position.
func (t *Translation) Advance(srcNext, dstNext int64) { t.end = Entry{Src: srcNext, Dst: dstNext} }

// Restore loads persisted entries and the checkpointed position.
func (t *Translation) Restore(entries []Entry, end Entry) {
	t.entries = append(t.entries[:0], entries...)
	sort.Slice(t.entries, func(i, j int) bool { return t.entries[i].Src < t.entries[j].Src })
	t.end = end
}

// tail returns a translation holding only the last breakpoint and the
// mirrored position: enough for Observe to find where the mapping breaks
// after the position (Observe compares with the last entry only).
func (t *Translation) tail() Translation {
	out := Translation{end: t.end}
	if n := len(t.entries); n > 0 {
		out.entries = []Entry{t.entries[n-1]}
	}
	return out
}

// Entries returns a copy of the breakpoints.
func (t *Translation) Entries() []Entry { return append([]Entry(nil), t.entries...) }

// End returns the mirrored position.
func (t *Translation) End() Entry { return t.end }

// Translate returns the destination offset at which a consumer positioned
// at source offset o continues: that of the first mirrored record whose
// source offset is >= o. ok is false when o lies beyond the mirrored
// position (the answer is not known yet).
func (t *Translation) Translate(o int64) (int64, bool) {
	if o > t.end.Src {
		return 0, false
	}
	if o == t.end.Src {
		return t.end.Dst, true
	}
	if len(t.entries) == 0 || o < t.entries[0].Src {
		if len(t.entries) == 0 {
			return t.end.Dst, true
		}
		return t.entries[0].Dst, true
	}
	i := sort.Search(len(t.entries), func(i int) bool { return t.entries[i].Src > o }) - 1
	e := t.entries[i]
	d := e.Dst + (o - e.Src)
	limit := t.end.Dst
	if i+1 < len(t.entries) {
		limit = t.entries[i+1].Dst
	}
	if d > limit {
		d = limit
	}
	return d, true
}
