package fetch

import (
	"errors"
	"fmt"
)

// Offset lookups for the control plane: translating a source offset or a
// committed group offset to the destination (design.md section 5).

// Translate maps a source offset to the destination offset of a held
// partition (design.md section 5).
//
// It fails with ErrUnknownPartition when the engine does not mirror the
// partition right now, with a *BeforeStartError for an offset below where
// mirroring started (records the mirror never copied: a consumer moving
// over there would skip them), with a *BelowFloorError for an offset whose
// breakpoints were dropped to bound memory (translation_max_bytes), and
// with ErrNotMirroredYet beyond the mirrored position.
func (e *Engine) Translate(k Key, sourceOffset int64) (int64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.active() {
		return 0, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	if sourceOffset < p.spec.StartOffset {
		return 0, &BeforeStartError{Key: k, Offset: sourceOffset, Start: p.spec.StartOffset}
	}
	if f := p.xl.Floor(); sourceOffset < f {
		return 0, &BelowFloorError{Key: k, Offset: sourceOffset, Floor: f}
	}
	d, ok := p.xl.Translate(sourceOffset)
	if !ok {
		return 0, fmt.Errorf("%w: %s offset %d (mirrored up to %d)", ErrNotMirroredYet, k, sourceOffset, p.pos.SourceOffset)
	}
	return d, nil
}

// TranslateCommitted maps a group's committed source offset to the
// destination offset to commit for it, never past what has been mirrored:
// an offset beyond the mirrored position maps to the destination end
// (every record the group has not read yet that is mirrored is after it),
// and capped reports that. Errors are Translate's, except
// ErrNotMirroredYet.
func (e *Engine) TranslateCommitted(k Key, sourceOffset int64) (d int64, capped bool, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p, ok := e.parts[k]
	if !ok || !p.active() {
		return 0, false, fmt.Errorf("%w: %s", ErrUnknownPartition, k)
	}
	return translateCommitted(&p.xl, k, p.spec.StartOffset, sourceOffset)
}

func translateCommitted(xl *Translation, k Key, start, o int64) (int64, bool, error) {
	if o < start {
		return 0, false, &BeforeStartError{Key: k, Offset: o, Start: start}
	}
	if f := xl.Floor(); o < f {
		return 0, false, &BelowFloorError{Key: k, Offset: o, Floor: f}
	}
	if end := xl.End(); o > end.Src {
		return end.Dst, true, nil
	}
	d, _ := xl.Translate(o)
	return d, false, nil
}

// OffsetsStoreBytes is the memory the engine's index of the offsets topic
// takes, roughly (offsetStore.Bytes).
func (e *Engine) OffsetsStoreBytes() int64 { return e.store.Bytes() }

// ErrNotMirroredYet: the source offset lies beyond what has been mirrored.
var ErrNotMirroredYet = errors.New("offset not mirrored yet")

// BeforeStartError: the source offset lies below the partition's start
// offset, resolved when the topic was added (--start-from latest, or the
// log start of the source then).
type BeforeStartError struct {
	Key           Key
	Offset, Start int64
}

func (e *BeforeStartError) Error() string {
	return fmt.Sprintf("%s offset %d is before where mirroring started (%d): source records %d..%d were never mirrored, "+
		"so a consumer moving over from offset %d would skip them; it continues without a skip only from %d on",
		e.Key, e.Offset, e.Start, e.Offset, e.Start-1, e.Offset, e.Start)
}

// BelowFloorError: the source offset lies below the translation floor of a
// partition whose breakpoints outgrew translation_max_bytes (a compacted or
// transactional topic whose log start does not move): the breakpoints
// there were dropped, so the destination offset is not known, and kmirror
// does not guess it.
type BelowFloorError struct {
	Key           Key
	Offset, Floor int64
}

func (e *BelowFloorError) Error() string {
	return fmt.Sprintf("%s offset %d has no translation: only offsets from %d on keep theirs (the partition's breakpoints outgrew "+
		"translation_max_bytes and the oldest were dropped; raise it to keep more)", e.Key, e.Offset, e.Floor)
}
