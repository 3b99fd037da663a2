package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Realigning a walk after the source deleted records kmirror had already
// copied (DESIGN.md, "Source records deleted after they were mirrored").
//
// A walk starts at a checkpoint, which lags the data by up to
// checkpoint_interval. When the source's retention (or DeleteRecords)
// removes records past the checkpoint before a crash, pause or takeover
// resumes the partition, the walk cannot read them any more. The
// destination still holds kmirror's copies, and those can be proven
// kmirror's own without the source: each carries one of the partition's
// producer identities with exactly the next sequence, so (destination
// batches being a pure function of the source batches) it is the copy of
// the next source batch, whoever sent it. realign accepts such batches as
// mirrored, finds the copy of the source's first surviving batch among
// them by its content, and lets the walk verify from there as usual.

// realignMaxRefetch bounds how often realign starts over at a log start
// that moved while it read (retention running at that moment).
const realignMaxRefetch = 5

// firstSurvivor is the source's first batch at or after its log start.
type firstSurvivor struct {
	logStart int64
	// base is the offset of the first batch a fetch at logStart returns
	// (at or below logStart: DeleteRecords can cut inside a batch).
	base int64
	// data is the first item the data path would mirror from base, nil
	// when the source holds nothing to mirror past logStart; digest its
	// records' content.
	data   *item
	digest [sha256.Size]byte
}

// firstSourceBatch reads the source from its log start (logStart, or later
// if retention moves it meanwhile) to the first batch the data path would
// mirror, taking no record below after (the walk's source position).
func (e *Engine) firstSourceBatch(ctx context.Context, srcCl *kafka.Cluster, k Key, logStart, after int64) (firstSurvivor, error) {
	fs := firstSurvivor{logStart: logStart, base: -1}
	r, err := kafka.OpenPartitionReader(ctx, srcCl, k.Topic, k.Partition, logStart, true)
	if err != nil {
		return fs, err
	}
	defer r.Close()
	for refetch := 0; ; {
		fp, err := r.Fetch(ctx)
		var oor *kafka.OutOfRange
		if errors.As(err, &oor) && oor.Offset < oor.LogStart && refetch < realignMaxRefetch {
			refetch++
			fs.logStart, fs.base, r.Offset = oor.LogStart, -1, oor.LogStart
			continue
		}
		if err != nil {
			return fs, err
		}
		batches, need, err := kwire.SplitBatches(fp.Records)
		if err != nil {
			return fs, err
		}
		from := int64(-1)
		for _, b := range batches {
			if b.LastOffset() >= r.Offset {
				from = b.BaseOffset()
				break
			}
		}
		if from < 0 && need > 0 {
			r.MaxBytes = kafka.GrowFetch(r.MaxBytes, need)
			continue
		}
		if from < 0 {
			if fs.base < 0 {
				fs.base = fs.logStart
			}
			return fs, nil // nothing more committed
		}
		// Never below the walk's own position: a walk that started inside
		// a source batch (a re-encoded start) compares from there.
		from = max(min(from, r.Offset), after)
		if fs.base < 0 {
			fs.base = from
		}
		items, next, _, err := buildItems(fp.Records, fp.Aborted, from)
		if err != nil {
			return fs, err
		}
		for _, it := range items {
			if it.skip() {
				continue
			}
			recs, err := it.records()
			if err != nil {
				return fs, err
			}
			fs.data, fs.digest = it, recordsDigest(recs)
			return fs, nil
		}
		r.Offset = next // only aborted or control batches so far
	}
}

// recordsDigest hashes what a mirrored copy keeps of records: timestamp,
// key, value and headers, in order (not offsets or producer fields, which
// the copy changes).
func recordsDigest(recs []kwire.Record) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	put := func(v int64) {
		binary.BigEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
	bytesOf := func(b []byte) {
		if b == nil {
			put(-1)
			return
		}
		put(int64(len(b)))
		h.Write(b)
	}
	put(int64(len(recs)))
	for _, r := range recs {
		put(r.Timestamp)
		bytesOf(r.Key)
		bytesOf(r.Value)
		put(int64(len(r.Headers)))
		for _, hd := range r.Headers {
			bytesOf([]byte(hd.Key))
			bytesOf(hd.Value)
		}
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// candidate is a destination batch whose records are the source's first
// surviving batch, with kmirror's sequences as they stand before it.
type candidate struct {
	dst  int64
	own  ownSeqs
	dups int // duplicates found before it
}

// realign continues a walk that met source offsets sd.at.Src..logStart-1
// deleted at destination offset sd.at.Dst. It reads kmirror's batches on
// the destination from sd.at.Dst, each of which must carry one of the
// partition's identities with exactly that identity's next sequence (a
// repeat of an earlier sequence is a duplicate, stepped over as the walk
// does), and looks among them for the copy of the source's first surviving
// batch: as many destination records lie before it as mirrored source
// records were deleted, at most one per deleted offset. It sets res.end
// to where the walk goes on and returns the offset to fetch the source at.
//
// It finds, in this order:
//   - more than one batch with the copy's records, or one while kmirror's
//     batches stand for no more records than the offsets before it (so
//     "no copy" fits as well): repeated content, DIVERGED, since any pick
//     could lose or duplicate records;
//   - the copy: the batches before it are mirrored records, the walk
//     verifies from it;
//   - kmirror's batches going past the copy's place without it, a batch
//     that is not kmirror's, or a sequence that skips ahead: they cannot be
//     re-verified, DIVERGED with what is known;
//   - no copy, and kmirror's batches stand for every deleted offset: all
//     were mirrored, mirroring goes on at the log start;
//   - no copy, and they stand for fewer: the rest is not on the
//     destination (never mirrored, or only transaction markers and aborted
//     records: the deleted records can no longer tell), a gap (DIVERGED
//     with GapBelow, or skipped and recorded under resume --accept-gap,
//     gapBelow).
func (e *Engine) realign(ctx context.Context, srcCl *kafka.Cluster, k Key, xl *Translation, res *walkResult, sd sourceDeleted, pid kafka.ProducerID, gapBelow int64) (fetchAt int64, err error) {
	s, d := sd.at.Src, sd.at.Dst
	fs, err := e.firstSourceBatch(ctx, srcCl, k, sd.logStart, s)
	if err != nil {
		return 0, err
	}
	ra := &realignment{e: e, k: k, xl: xl, res: res, sd: sd, pid: pid, fs: fs, s: s, d: d, ls: fs.logStart,
		// The copy of the batch at fs.base follows at most one destination
		// record per source offset before it.
		dLin:    d + (fs.base - s),
		deleted: fmt.Sprintf("the source has since deleted offsets %d..%d", s, fs.logStart-1),
	}
	bothDeleted, err := ra.scan(ctx)
	if err != nil {
		return 0, err
	}
	if bothDeleted {
		// The source's first surviving batch was copied to a destination
		// offset that is gone as well: go on there (linear mapping), and
		// the walk maps the destination's deleted records to source
		// records from fs.base.
		res.own[pid] = kwire.NextSequence(res.own[pid], int32(ra.dLin-d))
		res.walked += ra.dLin - d
		res.observe(xl, sd.at, ra.dLin > d)
		res.end = Entry{Src: fs.base, Dst: ra.dLin}
		res.realigned = true
		e.logRealigned(k, sd, res.end, "both sides deleted the records past the checkpoint")
		return ra.ls, nil
	}
	return ra.decide(gapBelow)
}

// realignment is one realign: what it knows before reading the
// destination, and what scan found there.
type realignment struct {
	e       *Engine
	k       Key
	xl      *Translation
	res     *walkResult
	sd      sourceDeleted
	pid     kafka.ProducerID
	fs      firstSurvivor
	s, d    int64 // the walk's position: source offset s at destination offset d
	ls      int64 // the source's log start
	dLin    int64 // the last destination offset the copy of fs can be at
	deleted string

	// Found by scan.
	own        ownSeqs // each own identity's next sequence after kmirror's batches
	cands      []candidate
	dups       []duplicate
	dupRecords int64
	end        int64 // destination offset after kmirror's batches read
}

// cannot is a DIVERGED answer for batches that can no longer be verified.
func (ra *realignment) cannot(format string, args ...any) error {
	k := ra.k
	return &Divergence{Key: k, Reason: fmt.Sprintf(format, args...) + ", so they cannot be re-verified. To go on: kmirror remove --mirror " +
		k.Mirror + " --topic " + k.Topic + " (failover: the destination keeps what it has), or delete the destination topic, remove and add it again"}
}

// scan reads kmirror's batches on the destination from ra.d to the end of
// the log, checking their sequences and collecting the batches that hold
// the first surviving source batch's records. bothDeleted: destination
// retention deleted the copy's place too (the caller maps linearly).
func (ra *realignment) scan(ctx context.Context) (bothDeleted bool, err error) {
	k, res, fs, s, d := ra.k, ra.res, ra.fs, ra.s, ra.d
	dst, err := kafka.OpenPartitionReader(ctx, ra.e.dest, k.Topic, k.Partition, d, false)
	if err != nil {
		return false, err
	}
	defer dst.Close()
	ra.own = res.own.clone()
	ra.end = d
	deletedDst := int64(0)
	first := true
	for {
		batches, ended, err := dst.NextSettled(ctx)
		var oor *kafka.OutOfRange
		if errors.As(err, &oor) && oor.Offset < oor.LogStart && first {
			// Destination retention deleted kmirror's copies too.
			if ra.dLin < oor.LogStart {
				return true, nil
			}
			deletedDst, dst.Offset, ra.end = oor.LogStart-d, oor.LogStart, oor.LogStart
			continue
		}
		if err != nil {
			return false, err
		}
		if ended {
			return false, nil
		}
		for _, b := range batches {
			if fs.data != nil && b.BaseOffset() > ra.dLin {
				// Past where the copy can be: counted, and verified by
				// the walk if a copy was found.
				ra.end = b.LastOffset() + 1
				continue
			}
			id, ok := res.ownID(b)
			if !ok {
				return false, &Divergence{Key: k, Reason: fmt.Sprintf("destination offset %d past kmirror's last checkpoint (source offset %d) is %s; %s, so it cannot be compared%s",
					b.BaseOffset(), s, res.writer(b, ra.pid), ra.deleted, res.foreignAdvice(b))}
			}
			want := ra.own[id]
			if first && deletedDst > 0 {
				want = kwire.NextSequence(want, int32(deletedDst))
			}
			first = false
			if seqBehind(b.BaseSequence(), want) {
				ra.dups = append(ra.dups, duplicate{first: b.BaseOffset(), last: b.LastOffset(), producer: id, seq: b.BaseSequence()})
				ra.dupRecords += b.LastOffset() + 1 - b.BaseOffset()
				ra.end = b.LastOffset() + 1
				continue
			}
			if b.BaseSequence() != want {
				return false, ra.cannot("destination offsets %d..%d were written by kmirror after its last checkpoint, but its batch at %d has sequence %d "+
					"where %d was next (a batch of its is missing); %s", d, b.LastOffset(), b.BaseOffset(), b.BaseSequence(), want, ra.deleted)
			}
			if fs.data != nil {
				recs, err := b.Records()
				if err != nil {
					return false, fmt.Errorf("destination %s/%d: %w", k.Topic, k.Partition, err)
				}
				if recordsDigest(recs) == fs.digest {
					snap := ra.own.clone()
					snap[id] = want
					ra.cands = append(ra.cands, candidate{dst: b.BaseOffset(), own: snap, dups: len(ra.dups)})
				}
			}
			ra.own[id] = kwire.NextSequence(b.BaseSequence(), b.LastOffsetDelta()+1)
			ra.end = b.LastOffset() + 1
		}
	}
}

// decide picks realign's outcome from what scan found (the order in
// realign's doc) and returns the source offset to fetch at.
func (ra *realignment) decide(gapBelow int64) (int64, error) {
	k, res, fs, s, d, ls, end := ra.k, ra.res, ra.fs, ra.s, ra.d, ra.ls, ra.end
	mirrored := end - d - ra.dupRecords // source records the copies stand for
	// Without a copy, kmirror's batches stand for deleted offsets only:
	// at most one record per offset before the surviving batch.
	noCopy := fs.data == nil || mirrored <= fs.base-s
	if n := len(ra.cands); n > 1 || (n == 1 && noCopy) {
		// Repeated content: more than one reading of the destination fits
		// the source, and picking one could lose or duplicate records.
		at := make([]string, n)
		for i, c := range ra.cands {
			at[i] = fmt.Sprint(c.dst)
		}
		also := ""
		if noCopy {
			also = ", or none of them if the source's records before it were deleted before they were mirrored"
		}
		return 0, ra.cannot("destination offsets %d..%d were written by kmirror after its last checkpoint; %s, and the source's first surviving batch "+
			"(offset %d) has the same records as kmirror's batch at destination offset %s%s: which one copies it cannot be told",
			d, end-1, ra.deleted, fs.base, strings.Join(at, ", "), also)
	}
	if len(ra.cands) == 1 {
		c := ra.cands[0]
		res.own = c.own
		res.duplicates = append(res.duplicates, ra.dups[:c.dups]...)
		res.walked += c.dst - d
		for _, du := range ra.dups[:c.dups] {
			res.walked -= du.records() // stepped over, not mirrored records
		}
		res.observe(ra.xl, ra.sd.at, c.dst > d)
		res.end = Entry{Src: fs.base, Dst: c.dst}
		res.realigned = true
		ra.e.logRealigned(k, ra.sd, res.end, "kmirror's own batches accepted as mirrored")
		return ls, nil
	}
	if !noCopy {
		return 0, ra.cannot("destination offsets %d..%d were written by kmirror after its last checkpoint; %s, and none of them holds "+
			"the source's first surviving batch (offset %d)", d, end-1, ra.deleted, fs.base)
	}
	pLin := s + mirrored
	if pLin > ls {
		return 0, &sourceBehind{Divergence{Key: k, Reason: fmt.Sprintf(
			"destination offsets %d..%d were written by kmirror after its last checkpoint, more records than the source had at offsets %d..%d "+
				"before it deleted them, and the source holds nothing after them: the source lost records that were mirrored", d, end-1, s, ls-1)}}
	}
	if pLin < ls {
		if gapBelow < 0 || res.gap != nil || (gapBelow > 0 && ls > gapBelow) {
			reason := sourceGapReason(k, pLin, ls)
			if mirrored > 0 {
				reason = copiedGapReason(k, Entry{Src: s, Dst: d}, end, mirrored, pLin, ls)
			}
			return 0, &Divergence{Key: k, Reason: reason, GapBelow: ls}
		}
		res.gap = &gapRange{from: pLin, to: ls}
	}
	res.own = ra.own
	res.duplicates = append(res.duplicates, ra.dups...)
	res.walked += mirrored
	res.observe(ra.xl, ra.sd.at, mirrored > 0)
	res.end = Entry{Src: ls, Dst: end}
	res.realigned = true
	ra.e.logRealigned(k, ra.sd, res.end, "every record deleted on the source had been mirrored, or was skipped as a gap")
	return ls, nil
}

// copiedGapReason explains source offsets deleted since at.Src (up to
// logStart) of which kmirror's copies (destination offsets at.Dst up to
// end) stand for only some: the others held records never mirrored, or
// only transaction markers and aborted records, which are not copied; the
// deleted records can no longer tell which. mirrored is how many records
// the copies hold (duplicates aside); from is where the missing ones start
// if there were no markers.
func copiedGapReason(k Key, at Entry, end, mirrored, from, logStart int64) string {
	missing := logStart - from
	return fmt.Sprintf("the source has deleted offsets %d..%d of %s, and kmirror's copies on the destination (offsets %d..%d, written after its "+
		"last checkpoint) stand for %d of them: the other %d (source offsets %d..%d if the deleted ones held no transaction markers or aborted "+
		"records, which are not copied) were never mirrored, or were only such markers and aborted records; the deleted records can no longer "+
		"tell which; the source log starts at %d. Nothing after them is lost. To mirror on from %d, counting at most %d records as lost: "+
		"kmirror resume --mirror %s --topic %s --partition %d --accept-gap",
		at.Src, logStart-1, k, at.Dst, end-1, mirrored, missing, from, logStart-1, logStart, logStart, missing, k.Mirror, k.Topic, k.Partition)
}

// observe records in xl that the copies accepted from at on (when any)
// start there: the copy of source offset at.Src, or of the first record
// after it, is destination offset at.Dst. Translating a source offset
// among the deleted ones then lands on the first mirrored record at or
// after it, assuming no transaction markers or aborted records among
// them (they are no longer readable to tell).
func (w *walkResult) observe(xl *Translation, at Entry, any bool) {
	if !any {
		return
	}
	if en, ok := xl.Observe(at.Src, at.Dst); ok {
		w.entries = append(w.entries, en)
	}
}

// logRealigned says where a walk went on after the source deleted records
// it had to read.
func (e *Engine) logRealigned(k Key, sd sourceDeleted, to Entry, why string) {
	e.log.Info("the source deleted records past the checkpoint; walking on", zap.Stringer("partition", k),
		zap.Int64("deleted_from", sd.at.Src), zap.Int64("source_log_start", sd.logStart),
		zap.Int64("source_offset", to.Src), zap.Int64("destination_offset", to.Dst), zap.String("how", why))
}
