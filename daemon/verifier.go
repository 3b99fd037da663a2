package daemon

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/daemon/ops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// Background verification (issue 22, section 4; mirror property
// verify.mode, off by default): each member compares the destination with
// the source for the offsets its MIRRORING partitions have mirrored,
// record by record through the exact translation, within
// verify.records.per.sec and verify.bytes.per.sec per mirror. Sampled
// mode compares one record at a random mirrored offset at a time; full
// mode makes a rolling pass over every mirrored record, then starts again.
// A difference makes the partition DIVERGED with both offsets.

// verifyTick is how often the verifier spends its per-second budget.
const verifyTick = time.Second

// verifyProgress is one partition's background verification as describe
// and /metrics show it.
type verifyProgress struct {
	// UpTo is the source offset below which every mirrored record was
	// compared in the latest complete pass or the current one, whichever
	// reaches further (full), or the highest sampled offset plus one
	// (sampled); Records counts the records compared
	// since this member took the partition; Mismatch is the difference
	// found ("" none); AtMs is when it last compared (Unix ms).
	UpTo, Records int64
	Mismatch      string
	AtMs          int64
	// Gone is the latest copy found deleted on the destination (errGone);
	// Skipped why the partition is not verified (a compacted topic).
	Gone, Skipped string
	// cursor is where a full pass goes on (-1: start a pass).
	cursor int64
}

// verifier holds the background verification of this member's partitions.
type verifier struct {
	mu    sync.Mutex
	byKey map[fetch.Key]*verifyProgress
	// budget is each mirror's records and bytes left (negative: a
	// deficit), by mirror name.
	budget map[string][2]int64
	// compacted caches, by mirror and topic, why a topic is not verified
	// (ops.CompactedReason; "" verified), read again after
	// compactedRecheck.
	compacted map[[2]string]compactedCheck
}

// compactedCheck is a topic's ops.CompactedReason and when it was read.
type compactedCheck struct {
	reason string
	at     time.Time
}

// compactedRecheck is how long a topic's cleanup.policy is taken as read.
const compactedRecheck = time.Minute

// progress returns a copy of each partition's verification.
func (v *verifier) progress() map[fetch.Key]verifyProgress {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[fetch.Key]verifyProgress, len(v.byKey))
	for k, p := range v.byKey {
		out[k] = *p
	}
	return out
}

// retain forgets the partitions this member no longer holds.
func (v *verifier) retain(held []fetch.Status) {
	keep := make(map[fetch.Key]bool, len(held))
	for _, st := range held {
		keep[st.Key] = true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for k := range v.byKey {
		if !keep[k] {
			delete(v.byKey, k)
		}
	}
}

func (v *verifier) state(k fetch.Key) *verifyProgress {
	if v.byKey == nil {
		v.byKey = map[fetch.Key]*verifyProgress{}
	}
	p, ok := v.byKey[k]
	if !ok {
		p = &verifyProgress{UpTo: -1, cursor: -1}
		v.byKey[k] = p
	}
	return p
}

// verifyLoop runs the background verification until ctx ends.
func (m *Member) verifyLoop(ctx context.Context) {
	t := time.NewTicker(verifyTick)
	defer t.Stop()
	admins := map[string]*kafka.Admin{} // per mirror, by source key
	keys := map[string]string{}
	defer func() {
		for _, a := range admins {
			a.Close()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.verifyRound(ctx, admins, keys)
	}
}

// verifyRound spends one tick's budget of each mirror with verification
// on over the partitions this member mirrors, the least recently verified
// first.
func (m *Member) verifyRound(ctx context.Context, admins map[string]*kafka.Admin, keys map[string]string) {
	mirrors := map[string]*verifyWork{}
	m.store.Read(func(s *raftstore.State) {
		for name, mir := range s.Mirrors {
			set, err := mirrorprops.Parse(name, mir.Properties)
			if err != nil || set.Verify.Mode == mirrorprops.VerifyOff {
				continue
			}
			mirrors[name] = &verifyWork{mir: *mir.Clone(), settings: set.Verify, starts: map[fetch.Key]int64{}}
		}
		for _, t := range s.Topics {
			if w, ok := mirrors[t.Mirror]; ok {
				for i, p := range t.Partitions {
					w.starts[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}] = p.StartOffset
				}
			}
		}
	})
	for name, a := range admins {
		if w, ok := mirrors[name]; !ok || keys[name] != m.SourceKey(w.mir) {
			a.Close()
			delete(admins, name)
		}
	}
	if len(mirrors) == 0 {
		m.verify.retain(nil) // verification turned off: nothing to show
		return
	}
	statuses := m.engine.Statuses()
	// Only the partitions of mirrors verified now keep their progress: a
	// mirror turned off shows no claims from before.
	verified := statuses[:0:0]
	for _, st := range statuses {
		if _, ok := mirrors[st.Key.Mirror]; ok {
			verified = append(verified, st)
		}
	}
	m.verify.retain(verified)
	prog := m.verify.progress()
	sort.SliceStable(statuses, func(i, j int) bool { return prog[statuses[i].Key].AtMs < prog[statuses[j].Key].AtMs })
	// Each mirror's budget refills by its rate each tick, up to one
	// second's worth; an overrun (a batch larger than what was left) is
	// carried as a deficit into the next ticks.
	budget := m.verify.refill(mirrors)
	for _, st := range statuses {
		w, ok := mirrors[st.Key.Mirror]
		left := budget[st.Key.Mirror]
		if !ok || st.State != fetch.Mirroring || left[0] <= 0 || left[1] <= 0 || ctx.Err() != nil {
			continue
		}
		src, ok := admins[st.Key.Mirror]
		if !ok {
			src = m.SourceAdmin(w.mir)
			admins[st.Key.Mirror], keys[st.Key.Mirror] = src, m.SourceKey(w.mir)
		}
		if why, err := m.notVerified(ctx, src, st.Key); err != nil || why != "" {
			if err != nil {
				m.log.Debug("background verification: the topic's configs could not be read; tried again next round", zap.Stringer("partition", st.Key), zap.Error(err))
			}
			continue
		}
		floor := max(st.TranslationFloor, w.starts[st.Key])
		records, bytes, err := m.verifyPartition(ctx, src, st, w.settings.Mode, floor, left[0])
		if err != nil {
			m.log.Debug("background verification: a read failed; tried again next round", zap.Stringer("partition", st.Key), zap.Error(err))
		}
		budget[st.Key.Mirror] = [2]int64{left[0] - records, left[1] - bytes}
	}
	m.verify.mu.Lock()
	m.verify.budget = budget
	m.verify.mu.Unlock()
}

// verifyWork is a mirror with verification on, as a round reads it: its
// settings and each partition's StartOffset.
type verifyWork struct {
	mir      raftstore.Mirror
	settings mirrorprops.Verify
	starts   map[fetch.Key]int64
}

// refill adds a tick's rate to each mirror's budget, up to one second's
// worth, keeping a deficit; mirrors no longer verified are dropped.
func (v *verifier) refill(mirrors map[string]*verifyWork) map[string][2]int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string][2]int64, len(mirrors))
	for name, w := range mirrors {
		r, b := [2]int64{w.settings.RecordsPerSec, w.settings.BytesPerSec}, v.budget[name]
		out[name] = [2]int64{min(b[0]+r[0], r[0]), min(b[1]+r[1], r[1])}
	}
	return out
}

// verifyPartition compares up to limit records of one partition from floor
// (source offset) to its mirrored position; it returns the records and
// bytes read. A difference stops the partition as DIVERGED.
func (m *Member) verifyPartition(ctx context.Context, src *kafka.Admin, st fetch.Status, mode string, floor, limit int64) (int64, int64, error) {
	k, to := st.Key, st.Position.SourceOffset
	// The partition's own log starts: listing partitions 0..k (Offsets)
	// for each partition made a round over P partitions ask for P²/2.
	srcStart, err := src.Cluster().ListOffset(ctx, k.Topic, k.Partition, kafka.Earliest)
	if err != nil {
		return 0, 0, err
	}
	dstStart, err := m.dest.Cluster().ListOffset(ctx, k.Topic, k.Partition, kafka.Earliest)
	if err != nil {
		return 0, 0, err
	}
	from := max(floor, srcStart)
	if from >= to {
		return 0, 0, nil // nothing mirrored that the source still holds
	}
	var res fetch.VerifyResult
	var records int64
	switch mode {
	case mirrorprops.VerifySampled:
		// Up to maxSamplesPerRound random offsets, one record each.
		for range min(limit, maxSamplesPerRound) {
			at := from + rand.Int64N(to-from)
			r, err := m.verifyAt(ctx, src, k, at, at+1, dstStart, 1)
			var gone errGone
			if errors.As(err, &gone) {
				m.verify.gone(k, gone)
				continue
			}
			if err != nil {
				return records, res.Bytes, err
			}
			records++
			res.Compared, res.Bytes = res.Compared+r.Compared, res.Bytes+r.Bytes
			m.verify.note(k, r, func(vp *verifyProgress) { vp.UpTo = max(vp.UpTo, at+1) })
			if r.Mismatch != "" {
				res.Mismatch, res.MismatchSource, res.MismatchDestination = r.Mismatch, r.MismatchSource, r.MismatchDestination
				break
			}
		}
	default:
		m.verify.mu.Lock()
		vp := m.verify.state(k)
		if vp.cursor < from || vp.cursor >= to {
			vp.cursor = from // a new pass
		}
		at := vp.cursor
		m.verify.mu.Unlock()
		n := min(limit, to-at)
		res, err = m.verifyAt(ctx, src, k, at, at+n, dstStart, n)
		var gone errGone
		if errors.As(err, &gone) {
			// Skip to the first source offset whose copy is still there.
			m.verify.gone(k, gone)
			next := m.firstKept(k, at, to, dstStart)
			m.verify.mu.Lock()
			m.verify.state(k).cursor = next
			m.verify.mu.Unlock()
			return 1, 0, nil
		}
		if err != nil {
			return 0, 0, err
		}
		records = max(res.Compared, 1)
		// Without a mismatch VerifyRange compared every committed record of
		// [at, at+n) (fewer than n where a transaction aborted or
		// compaction removed some).
		// UpTo keeps the last complete pass's end while the next pass is
		// below it: every record below it was compared in the latest pass.
		m.verify.note(k, res, func(vp *verifyProgress) { vp.cursor, vp.UpTo = at+n, max(vp.UpTo, at+n) })
	}
	if res.Mismatch != "" {
		reason := "background verification (verify.mode=" + mode + ") found the destination differing from the source: " + res.Mismatch
		if m.engine.Diverge(k, reason) {
			m.log.Error("background verification found a difference; partition DIVERGED", zap.Stringer("partition", k),
				zap.Int64("source_offset", res.MismatchSource), zap.Int64("destination_offset", res.MismatchDestination), zap.String("mismatch", res.Mismatch))
		}
	}
	return records, res.Bytes, nil
}

// maxSamplesPerRound bounds the records sampled mode compares per
// partition each round.
const maxSamplesPerRound = 100

// verifyAt compares the source records [at, to) (at most n) with their
// copies from the translation of at on; a copy below the destination's log
// start (deleted there) is a mismatch.
func (m *Member) verifyAt(ctx context.Context, src *kafka.Admin, k fetch.Key, at, to, dstStart, n int64) (fetch.VerifyResult, error) {
	dstAt, err := m.engine.Translate(k, at)
	if err != nil {
		return fetch.VerifyResult{}, fmt.Errorf("translate source offset %d: %w", at, err)
	}
	if dstAt < dstStart {
		return fetch.VerifyResult{}, errGone{at: at, dst: dstAt, dstStart: dstStart}
	}
	return fetch.VerifyRange(ctx, src, m.dest, k.Topic, k.Partition, at, to, dstAt, n)
}

// firstKept is the first source offset in (at, to] whose copy is at or
// past the destination's log start dstStart (to when none): a binary
// search over the translation, which never decreases.
func (m *Member) firstKept(k fetch.Key, at, to, dstStart int64) int64 {
	lo, hi := at+1, to
	for lo < hi {
		mid := lo + (hi-lo)/2
		if d, err := m.engine.Translate(k, mid); err == nil && d >= dstStart {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// errGone is a copy below the destination's log start: deleted there by
// retention (the clusters roll segments at different times, so the
// destination may delete a copy the source still holds) or by
// DeleteRecords. It cannot be compared, and is no difference: the
// background verification notes it and moves on (kmirror verify, asked by
// an operator, reports it as a mismatch).
type errGone struct{ at, dst, dstStart int64 }

func (e errGone) Error() string {
	return fmt.Sprintf("source offset %d: its copy at destination offset %d is gone, the destination's log starts at %d "+
		"(retention or DeleteRecords on the destination): not compared", e.at, e.dst, e.dstStart)
}

// notVerified is why k's topic is not verified ("" when it is: see
// ops.CompactedReason), read at most every compactedRecheck; a reason is
// noted on the partition.
func (m *Member) notVerified(ctx context.Context, src *kafka.Admin, k fetch.Key) (string, error) {
	v := &m.verify
	tk := [2]string{k.Mirror, k.Topic}
	v.mu.Lock()
	c, ok := v.compacted[tk]
	v.mu.Unlock()
	if !ok || time.Since(c.at) >= compactedRecheck {
		why, err := ops.CompactedReason(ctx, src, m.dest, k.Topic)
		if err != nil {
			return "", err
		}
		c = compactedCheck{reason: why, at: time.Now()}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.compacted == nil {
		v.compacted = map[[2]string]compactedCheck{}
	}
	v.compacted[tk] = c
	v.state(k).Skipped = c.reason
	return c.reason, nil
}

// gone notes a copy deleted on the destination (errGone).
func (v *verifier) gone(k fetch.Key, g errGone) {
	v.mu.Lock()
	defer v.mu.Unlock()
	vp := v.state(k)
	vp.Gone, vp.AtMs = g.Error(), time.Now().UnixMilli()
}

// note records a comparison's outcome on k: the records compared, when,
// the mismatch (cleared by a clean comparison), and update's changes.
func (v *verifier) note(k fetch.Key, res fetch.VerifyResult, update func(*verifyProgress)) {
	v.mu.Lock()
	defer v.mu.Unlock()
	vp := v.state(k)
	vp.Records += res.Compared
	vp.AtMs = time.Now().UnixMilli()
	vp.Mismatch = res.Mismatch
	if res.Mismatch == "" {
		update(vp)
	}
}
