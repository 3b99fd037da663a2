package fetch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
)

// Entry is one breakpoint of the offset-translation log: from source offset
// Src on, mirrored records sit at Dst + (src - Src) until the next entry.
type Entry struct {
	Src int64
	Dst int64
}

// segEntries is how many breakpoints one segment of the translation log
// holds. A segment is one record of the offsets topic (key: its first
// source offset), delta-encoded: a few bytes per breakpoint, so a full
// segment stays far below any max.message.bytes.
const segEntries = 1024

// xlSeg is a run of breakpoints: sealed (full) segments are kept encoded,
// only the last one decoded, so memory per breakpoint is what the offsets
// topic stores (2-6 bytes), not 16.
type xlSeg struct {
	base     int64 // Src of the first entry
	firstDst int64
	n        int
	enc      []byte  // encoded entries; nil while open
	open     []Entry // the last segment's entries, decoded
}

// entries returns the segment's breakpoints.
func (s *xlSeg) entries() []Entry {
	if s.enc == nil {
		return s.open
	}
	es, err := decodeSegment(s.enc)
	if err != nil {
		panic(fmt.Sprintf("translation segment at %d was encoded by this process and does not decode: %v", s.base, err))
	}
	return es
}

// encoded returns the segment's record value.
func (s *xlSeg) encoded() []byte {
	if s.enc != nil {
		return s.enc
	}
	return encodeSegment(s.open)
}

// Translation is the exact source -> destination offset map of one
// partition (design.md section 5). Entries are needed only where the
// mapping breaks (skipped aborted or control records, compaction holes, the
// start offset, a gap); with no gaps a partition has one entry. Its size is
// bounded by the source's retention (Trim drops segments wholly below the
// source's log start offset) and by SetLimit: a compacted or transactional
// topic whose log start never moves keeps only its newest breakpoints, and
// offsets below the floor they start at have no translation.
type Translation struct {
	segs []xlSeg
	// limit bounds Bytes (0: no bound); floor is the source offset from
	// which breakpoints are kept: those below were dropped by the limit
	// (0: none dropped).
	limit int64
	floor int64
	// end is the mirrored position: every source offset below end.Src has
	// been decided (mirrored or skipped), and end.Dst is the next
	// destination offset.
	end Entry
	// dirtyFrom is the base of the first segment changed since the last
	// takeUnsaved (math.MaxInt64: none); dropped are the bases trimmed
	// since then, to delete from the offsets topic.
	dirtyFrom int64
	dropped   []int64
}

func (t *Translation) last() (Entry, bool) {
	if len(t.segs) == 0 {
		return Entry{}, false
	}
	s := &t.segs[len(t.segs)-1]
	if s.enc == nil {
		return s.open[len(s.open)-1], true
	}
	es := s.entries()
	return es[len(es)-1], true
}

// Observe records that the source record at src was mirrored to dst. It
// returns the new breakpoint when the mapping broke at src (the caller
// persists it through takeUnsaved).
func (t *Translation) Observe(src, dst int64) (Entry, bool) {
	if last, ok := t.last(); ok {
		// Gaps only ever lower dst-src, so comparing with the last entry
		// is enough to know whether the mapping broke.
		if src-last.Src == dst-last.Dst {
			return Entry{}, false
		}
	}
	e := Entry{Src: src, Dst: dst}
	t.add(e)
	return e, true
}

// add appends a breakpoint, sealing the last segment when it is full.
func (t *Translation) add(e Entry) {
	if len(t.segs) == 0 && t.dirtyFrom == 0 && len(t.dropped) == 0 {
		t.dirtyFrom = math.MaxInt64 // the zero Translation
	}
	n := len(t.segs)
	if n == 0 || t.segs[n-1].n >= segEntries {
		if n > 0 && t.segs[n-1].enc == nil {
			t.segs[n-1].enc = encodeSegment(t.segs[n-1].open)
			t.segs[n-1].open = nil
		}
		t.segs = append(t.segs, xlSeg{base: e.Src, firstDst: e.Dst})
		n++
	}
	s := &t.segs[n-1]
	if s.enc != nil { // a restored sealed-looking last segment: reopen it
		s.open, s.enc = s.entries(), nil
	}
	s.open = append(s.open, e)
	s.n++
	t.dirtyFrom = min(t.dirtyFrom, s.base)
	if s.n == 1 && n > 1 {
		t.bound() // a segment was sealed
	}
}

// SetLimit bounds the memory the breakpoints take to about maxBytes (the
// daemon's translation_max_bytes; 0: no bound) and applies it at once.
// When a segment is sealed past the bound, the oldest segments are dropped
// (deleted from the offsets topic with the next checkpoint) and the floor
// moves up to the first one kept; the open segment always stays, so the
// bound is exceeded by at most one segment (segEntries breakpoints).
func (t *Translation) SetLimit(maxBytes int64) {
	t.limit = maxBytes
	t.bound()
}

func (t *Translation) bound() {
	if t.limit <= 0 {
		return
	}
	total := t.Bytes()
	k := 0
	for k+1 < len(t.segs) && total > t.limit {
		total -= t.segs[k].bytes()
		t.dropped = append(t.dropped, t.segs[k].base)
		k++
	}
	if k > 0 {
		t.floor = max(t.floor, t.segs[k].base)
		t.segs = append([]xlSeg(nil), t.segs[k:]...)
	}
}

// Floor returns the source offset from which the translation is kept: 0
// unless SetLimit dropped older breakpoints. Offsets below it (and at or
// above the source's log start) have no translation here: Translate says
// so rather than guess.
func (t *Translation) Floor() int64 { return t.floor }

// setFloor restores a floor persisted with the checkpoint.
func (t *Translation) setFloor(f int64) { t.floor = max(t.floor, f) }

// Advance moves the mirrored position.
func (t *Translation) Advance(srcNext, dstNext int64) { t.end = Entry{Src: srcNext, Dst: dstNext} }

// Restore loads breakpoints (built in a test, or persisted one record
// each by an older build) and the checkpointed position; they count as
// unsaved in the segment format.
func (t *Translation) Restore(entries []Entry, end Entry) {
	t.restoreSegments(nil, entries, end)
}

// restoreSegments loads persisted segments (sorted by base) and the
// checkpointed position end. Breakpoints of an older build's records
// (legacy) are merged in and count as unsaved. Breakpoints at or past
// end.Src are dropped: a write can persist a segment and fail before its
// checkpoint, and the walk from the checkpoint observes them again.
func (t *Translation) restoreSegments(segs []xlSeg, legacy []Entry, end Entry) {
	*t = Translation{end: end, dirtyFrom: math.MaxInt64}
	if len(legacy) > 0 {
		all := append([]Entry(nil), legacy...)
		for i := range segs {
			all = append(all, segs[i].entries()...)
			t.dropped = append(t.dropped, segs[i].base)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Src < all[j].Src })
		for i := range all {
			if all[i].Src >= end.Src {
				break
			}
			if i > 0 && all[i].Src == all[i-1].Src {
				continue
			}
			t.add(all[i])
		}
		// Every base written anew is not to be deleted.
		kept := t.dropped[:0]
		for _, b := range t.dropped {
			if j := sort.Search(len(t.segs), func(i int) bool { return t.segs[i].base >= b }); j == len(t.segs) || t.segs[j].base != b {
				kept = append(kept, b)
			}
		}
		t.dropped = kept
		return
	}
	t.segs = segs
	for len(t.segs) > 0 {
		last := &t.segs[len(t.segs)-1]
		es := last.entries()
		cut := sort.Search(len(es), func(i int) bool { return es[i].Src >= end.Src })
		if cut == len(es) {
			// Keep the last segment decoded: Observe compares with its
			// last entry at every record.
			last.open, last.enc = es, nil
			return
		}
		t.dirtyFrom = min(t.dirtyFrom, last.base)
		if cut == 0 {
			t.dropped = append(t.dropped, last.base)
			t.segs = t.segs[:len(t.segs)-1]
			continue
		}
		last.open, last.enc, last.n = es[:cut], nil, cut
		return
	}
}

// Trim drops the segments that lie wholly below the source's log start
// offset logStart (the next segment starts at or below it): no consumer
// can read those source offsets any more. The last breakpoint at or below
// logStart stays, so offsets from logStart on translate as before.
func (t *Translation) Trim(logStart int64) {
	k := 0
	for k+1 < len(t.segs) && t.segs[k+1].base <= logStart {
		t.dropped = append(t.dropped, t.segs[k].base)
		k++
	}
	if k > 0 {
		t.segs = append([]xlSeg(nil), t.segs[k:]...)
	}
}

// segRecord is one segment to write to the offsets topic.
type segRecord struct {
	base  int64
	value []byte
}

// takeUnsaved returns the segments changed and the bases dropped since the
// last call, and marks them saved; requeue gives them back after a failed
// write.
func (t *Translation) takeUnsaved() (segs []segRecord, dropped []int64) {
	for i := range t.segs {
		if t.segs[i].base >= t.dirtyFrom {
			segs = append(segs, segRecord{base: t.segs[i].base, value: t.segs[i].encoded()})
		}
	}
	dropped = t.dropped
	t.dirtyFrom, t.dropped = math.MaxInt64, nil
	return segs, dropped
}

// requeue marks segments and drops of a failed write unsaved again.
func (t *Translation) requeue(segs []segRecord, dropped []int64) {
	for _, s := range segs {
		t.dirtyFrom = min(t.dirtyFrom, s.base)
	}
	t.dropped = append(dropped, t.dropped...)
}

// tail returns a translation holding only the last breakpoint and the
// mirrored position: enough for Observe to find where the mapping breaks
// after the position (Observe compares with the last entry only).
func (t *Translation) tail() Translation {
	out := Translation{end: t.end, dirtyFrom: math.MaxInt64}
	if last, ok := t.last(); ok {
		out.add(last)
	}
	return out
}

// Entries returns a copy of the breakpoints.
func (t *Translation) Entries() []Entry {
	var out []Entry
	for i := range t.segs {
		out = append(out, t.segs[i].entries()...)
	}
	return out
}

// Len is the number of breakpoints held.
func (t *Translation) Len() int {
	n := 0
	for i := range t.segs {
		n += t.segs[i].n
	}
	return n
}

// Bytes is the memory the breakpoints take, roughly.
func (t *Translation) Bytes() int64 {
	var n int64
	for i := range t.segs {
		n += t.segs[i].bytes()
	}
	return n
}

// bytes is the memory a segment takes, roughly.
func (s *xlSeg) bytes() int64 { return int64(len(s.enc)) + 16*int64(cap(s.open)) + 64 }

// End returns the mirrored position.
func (t *Translation) End() Entry { return t.end }

// Translate returns the destination offset at which a consumer positioned
// at source offset o continues: that of the first mirrored record whose
// source offset is >= o. ok is false when o lies beyond the mirrored
// position (the answer is not known yet) or below the floor (the
// breakpoints there were dropped: see SetLimit).
func (t *Translation) Translate(o int64) (int64, bool) {
	if o > t.end.Src || o < t.floor {
		return 0, false
	}
	if o == t.end.Src {
		return t.end.Dst, true
	}
	if len(t.segs) == 0 {
		return t.end.Dst, true
	}
	j := sort.Search(len(t.segs), func(i int) bool { return t.segs[i].base > o }) - 1
	if j < 0 {
		return t.segs[0].firstDst, true
	}
	es := t.segs[j].entries()
	i := sort.Search(len(es), func(i int) bool { return es[i].Src > o }) - 1
	e := es[i]
	d := e.Dst + (o - e.Src)
	limit := t.end.Dst
	switch {
	case i+1 < len(es):
		limit = es[i+1].Dst
	case j+1 < len(t.segs):
		limit = t.segs[j+1].firstDst
	}
	if d > limit {
		d = limit
	}
	return d, true
}

// Segment value layout (version 1): version byte, uvarint count, varint
// first Src, varint first Dst, then per further entry uvarint Src delta
// (always > 0) and varint Dst delta.
const segVersion = 1

func encodeSegment(es []Entry) []byte {
	b := make([]byte, 0, 2+len(es)*4+16)
	b = append(b, segVersion)
	b = binary.AppendUvarint(b, uint64(len(es)))
	for i, e := range es {
		if i == 0 {
			b = binary.AppendVarint(b, e.Src)
			b = binary.AppendVarint(b, e.Dst)
			continue
		}
		b = binary.AppendUvarint(b, uint64(e.Src-es[i-1].Src))
		b = binary.AppendVarint(b, e.Dst-es[i-1].Dst)
	}
	return b
}

var errBadSegment = errors.New("malformed translation segment")

func decodeSegment(b []byte) ([]Entry, error) {
	if len(b) < 2 || b[0] != segVersion {
		return nil, fmt.Errorf("%w: version %v", errBadSegment, b[:min(len(b), 1)])
	}
	b = b[1:]
	n, k := binary.Uvarint(b)
	if k <= 0 || n == 0 || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: count", errBadSegment)
	}
	b = b[k:]
	out := make([]Entry, 0, n)
	var prev Entry
	for i := uint64(0); i < n; i++ {
		var e Entry
		if i == 0 {
			s, k1 := binary.Varint(b)
			if k1 <= 0 {
				return nil, errBadSegment
			}
			d, k2 := binary.Varint(b[k1:])
			if k2 <= 0 {
				return nil, errBadSegment
			}
			e, b = Entry{Src: s, Dst: d}, b[k1+k2:]
		} else {
			ds, k1 := binary.Uvarint(b)
			if k1 <= 0 || ds == 0 {
				return nil, errBadSegment
			}
			dd, k2 := binary.Varint(b[k1:])
			if k2 <= 0 {
				return nil, errBadSegment
			}
			e, b = Entry{Src: prev.Src + int64(ds), Dst: prev.Dst + dd}, b[k1+k2:]
		}
		out = append(out, e)
		prev = e
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errBadSegment, len(b))
	}
	return out, nil
}

// segmentFromValue makes a sealed segment of a persisted record value.
func segmentFromValue(v []byte) (xlSeg, error) {
	es, err := decodeSegment(v)
	if err != nil {
		return xlSeg{}, err
	}
	return xlSeg{base: es[0].Src, firstDst: es[0].Dst, n: len(es), enc: v}, nil
}
