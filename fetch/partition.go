package fetch

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"go.uber.org/zap"
)

// A partition's state on this member is four sub-states. Each changes only
// through the moves below (moveLife, moveRelease, moveSend, moveFetch),
// which check these tables: a move not listed is a programming error
// (illegalMove: a panic in tests, an error log in production, where the
// move is made anyway so behaviour does not depend on the check).
//
// life: where the partition is in its run here; reported as its State.
//
//	from \ to   starting mirroring failed renewing diverged stopped
//	(new)        x                                    x (parked)
//	starting     x        x         x                 x        x
//	mirroring    x                  x      x          x        x
//	failed       x        x         x                 x        x
//	renewing     x                                    x        x
//	diverged     x                                    x        x
//	stopped      -
//
//   - starting: the resume walk runs (STARTING); a restart after a failure
//     walks in failed and goes to mirroring directly.
//   - mirroring: fetching and producing (MIRRORING, or DRAINING while
//     released).
//   - failed: waiting out a backoff before the next start (FAILED).
//   - renewing: the destination refused the producer identity; nothing
//     runs until the control plane's new epoch arrives (FAILED).
//   - diverged: stopped for good until an operator resumes it (DIVERGED).
//   - stopped: dropped; the engine forgets it (STOPPED).
//
// release: whether the partition is being given up here.
//
//	none -> draining, dropped;  draining -> draining, dropped
//
//   - draining: Release, HandOff or Stop: fetch no more, finish the queue,
//     give the exact position back.
//   - dropped: Drop: stopped at once (the lease moved); life is stopped.
//
// send: the produce of the queue head (one at a time per partition).
//
//	idle -> idle, inflight, confirming;  inflight -> idle;
//	confirming -> confirming, idle
//
//   - inflight: the head is in a produce request.
//   - confirming: its outcome is unknown; nothing is sent until confirm has
//     read what the destination holds (DESIGN.md). A failure clears it
//     (the restart walks); an in-flight produce is waited for instead.
//
// fetch: whether the source may be fetched (besides life and release).
//
//	open -> open, outOfRange;  outOfRange -> open
//
//   - outOfRange: the source answered OFFSET_OUT_OF_RANGE; sourceOutOfRange
//     decides before anything more is fetched.
//
// Two booleans are facts about the data rather than states: resumed (the
// producer identity, position and translation are valid: set by the first
// successful start, never cleared) and dirty (the position changed since
// the last checkpoint).

type life uint8

const (
	lifeStarting life = iota
	lifeMirroring
	lifeFailed
	lifeRenewing
	lifeDiverged
	lifeStopped
)

type releasePhase uint8

const (
	releaseNone releasePhase = iota
	releaseDraining
	releaseDropped
)

type sendPhase uint8

const (
	sendIdle sendPhase = iota
	sendInflight
	sendConfirming
)

type fetchPhase uint8

const (
	fetchOpen fetchPhase = iota
	fetchOutOfRange
)

var (
	lifeNames    = []string{"starting", "mirroring", "failed", "renewing", "diverged", "stopped"}
	releaseNames = []string{"none", "draining", "dropped"}
	sendNames    = []string{"idle", "inflight", "confirming"}
	fetchNames   = []string{"open", "outOfRange"}

	lifeMoves = [][]life{
		lifeStarting:  {lifeStarting, lifeMirroring, lifeFailed, lifeDiverged, lifeStopped},
		lifeMirroring: {lifeStarting, lifeFailed, lifeRenewing, lifeDiverged, lifeStopped},
		lifeFailed:    {lifeStarting, lifeMirroring, lifeFailed, lifeDiverged, lifeStopped},
		lifeRenewing:  {lifeStarting, lifeDiverged, lifeStopped},
		lifeDiverged:  {lifeStarting, lifeDiverged, lifeStopped},
		lifeStopped:   {},
	}
	releaseMoves = [][]releasePhase{
		releaseNone:     {releaseDraining, releaseDropped},
		releaseDraining: {releaseDraining, releaseDropped},
		releaseDropped:  {},
	}
	sendMoves = [][]sendPhase{
		sendIdle:       {sendIdle, sendInflight, sendConfirming},
		sendInflight:   {sendIdle, sendInflight},
		sendConfirming: {sendConfirming, sendIdle},
	}
	fetchMoves = [][]fetchPhase{
		fetchOpen:       {fetchOpen, fetchOutOfRange},
		fetchOutOfRange: {fetchOpen},
	}
)

// strictMoves makes an illegal move panic (tests; KMIRROR_STRICT_TRANSITIONS=1
// for a daemon under test); otherwise it is logged through illegalLog.
var (
	strictMoves = os.Getenv("KMIRROR_STRICT_TRANSITIONS") == "1"
	illegalLog  atomic.Pointer[zap.Logger]
)

// illegalMove reports a move the tables do not list.
func (p *partition) illegalMove(kind, from, to string) {
	msg := fmt.Sprintf("partition %s: illegal %s move %s -> %s (life %s, release %s, send %s, fetch %s)", p.key(), kind, from, to,
		lifeNames[p.life], releaseNames[p.release], sendNames[p.send], fetchNames[p.fetch])
	if strictMoves {
		panic(msg)
	}
	if l := illegalLog.Load(); l != nil {
		l.Error("bug: " + msg)
	}
}

func (p *partition) moveLife(to life) { move(p, "life", lifeNames, lifeMoves, &p.life, to) }

func (p *partition) moveRelease(to releasePhase) {
	move(p, "release", releaseNames, releaseMoves, &p.release, to)
}

func (p *partition) moveSend(to sendPhase) {
	if to == sendInflight && p.send != sendInflight {
		p.sentAt = time.Now()
	}
	move(p, "send", sendNames, sendMoves, &p.send, to)
}

func (p *partition) moveFetch(to fetchPhase) { move(p, "fetch", fetchNames, fetchMoves, &p.fetch, to) }

// move sets *cur to to, checking the move against table.
func move[T ~uint8](p *partition, kind string, names []string, table [][]T, cur *T, to T) {
	if !slices.Contains(table[*cur], to) {
		p.illegalMove(kind, names[*cur], names[to])
	}
	*cur = to
}

// reported is the State describe and the control plane see.
func (p *partition) reported() State {
	switch p.life {
	case lifeStarting:
		return Starting
	case lifeMirroring:
		if p.release == releaseDraining {
			return Draining
		}
		return Mirroring
	case lifeFailed, lifeRenewing:
		return Failed
	case lifeDiverged:
		return Diverged
	}
	return Stopped
}

// releasing reports whether the partition is being given up here.
func (p *partition) releasing() bool { return p.release != releaseNone }

// mirroring reports whether it copies and is not being released.
func (p *partition) mirroring() bool { return p.life == lifeMirroring && p.release == releaseNone }

// partition is the engine's state for one leased partition. All fields are
// guarded by Engine.mu.
type partition struct {
	spec    Spec
	life    life
	release releasePhase
	send    sendPhase
	fetch   fetchPhase
	reason  string
	// gen counts (re)starts so a stale start goroutine or fetch response
	// can tell it is no longer current.
	gen int

	// Source side: who leads it, how far it is fetched.
	srcLeader   int32 // -1: route needed
	srcEpoch    int32
	fetchOffset int64
	fetchBytes  int32
	srcEnd      int64 // last stable offset at the last fetch; -1 unknown
	srcHW       int64 // high watermark at the last fetch
	// srcAnswered is when the partition's source leader last answered a
	// fetch that asked for it (a fetch session leaves unchanged partitions
	// out of its answer): srcEnd is as of then. srcAsked is when a fetch
	// for it was sent that has had no answer yet (zero: none).
	srcAnswered, srcAsked time.Time
	// sentAt is when the oldest batch in flight was sent (send is
	// sendInflight).
	sentAt time.Time
	// inflight counts the partition's batches in produce requests that
	// await their answers: the first inflight batches of the queue (skip
	// items aside), all on the connection inflightOn. send is sendInflight
	// while it is above 0 (sender.go, the produce window).
	inflight   int
	inflightOn *pipe
	// voided says why the answers of the batches still in flight are not
	// acted on: an earlier batch of the window failed or its outcome is
	// unknown, so what landed is established once they are all answered
	// (confirm, or renewIdentity when voidRenew).
	voided    string
	voidRenew bool
	// voidSpan is how many batches from the queue's head a void window
	// sent (the failed first one included): any of them may still land
	// until the void settles (inflightEnd).
	voidSpan int
	// ackedMaxTs is the newest record timestamp (ms) of the batch last
	// acknowledged in this run of the partition (since its start, last
	// confirm or identity renewal); acked says there is one. The window
	// widens only while the broker surely knows the producer
	// (windowAllowed).
	ackedMaxTs int64
	acked      bool
	// dstUnanswered is when a produce of this partition was sent that the
	// destination never answered (the request timed out after it was
	// written), while no produce of it has been answered since; zero
	// otherwise. A stalled destination link keeps it set through the
	// confirm walks and resends that follow (issue 18).
	dstUnanswered time.Time
	// fetchedEpoch is the source leader epoch of the last batch fetched
	// (at fetchOffset); -1 unknown. A new source leader is asked where it
	// ends (checkSourceTruncation).
	fetchedEpoch int32
	// gapBelow is the source log start of a gap divergence (see
	// Control.Report); 0 otherwise.
	gapBelow int64
	// srcMissing and dstMissing are when the topic was first found
	// missing on that side (zero: it exists); see route.
	srcMissing, dstMissing time.Time
	// dstVerified is when the destination topic was last known to be the
	// one kmirror created (a topic ID check, or an acknowledged batch).
	dstVerified time.Time

	// Destination side.
	dstLeader int32 // -1: route needed
	queue     []*item
	queued    int64 // bytes in queue
	producer  kafka.ProducerID
	resumed   bool // producer, pos and translation are valid (see above)
	nextSeq   int32
	// own holds every producer identity this partition was written with
	// since its checkpoint (the current one, one replaced by a renewal)
	// and its next sequence, to tell late copies from foreign writes.
	own      ownSeqs
	retryAt  time.Time
	failures int
	// quietStarts counts starts in a row that met a leadership change
	// (runStart), the first of them at quietSince; a start that resumes
	// clears it.
	quietStarts int
	quietSince  time.Time

	// Mirrored (acknowledged) progress and translation.
	pos   Position
	xl    Translation
	dirty bool

	// fetchErr and produceErr describe a retriable error the partition is
	// riding out (it stays MIRRORING); cleared by the next success.
	fetchErr   string
	produceErr string
	// throttled is set while the destination broker's produce responses
	// for this partition carry a throttle (noteThrottle).
	throttled string
	// checkpointErr is set while the partition's checkpoint cannot be
	// written; mirroring goes on (a crash then resumes from the last
	// written checkpoint with a longer walk).
	checkpointErr string

	// duplicateRecords counts records of kmirror's own batches found twice
	// on the destination since this member took the partition;
	// lastDuplicate describes the latest such batch.
	duplicateRecords int64
	// convertedRecords counts records mirrored from legacy (v0/v1)
	// message sets, converted to v2 (kwire/legacy.go), since this member
	// took the partition.
	convertedRecords int64
	lastDuplicate    string
	// progress counts what was mirrored, for rates and the time lag.
	progress progress
	// idleSeen is the destination offset at the previous idle check when
	// the partition was idle then (-1 otherwise); see checkIdle.
	idleSeen int64

	released chan struct{} // closed when a drain completes
}

func (p *partition) key() Key { return p.spec.Key }

// active reports whether the data path works on the partition (mirroring,
// or draining its queue).
func (p *partition) active() bool { return p.life == lifeMirroring }

// wantsFetch reports whether the fetcher should ask for more data.
func (p *partition) wantsFetch(limit int64) bool {
	return p.mirroring() && p.fetch == fetchOpen && p.srcLeader >= 0 && p.queued < limit
}

// drained reports whether a draining partition has nothing left to send.
func (p *partition) drained() bool { return len(p.queue) == 0 && p.send != sendInflight }

// headBatch is the first batch of the queue (skip items aside), or nil.
func (p *partition) headBatch() *item {
	for _, it := range p.queue {
		if !it.skip() {
			return it
		}
	}
	return nil
}

// nextToSend is the queue index of the first batch not in flight (-1:
// none) and the batch in flight before it (nil: none).
func (p *partition) nextToSend() (idx int, prev *item) {
	n := 0
	for i, it := range p.queue {
		if it.skip() {
			continue
		}
		if n == p.inflight {
			return i, prev
		}
		n++
		prev = it
	}
	return -1, prev
}

// inflightEnd is the queue index after the last batch in flight, or
// sent in a void window that has not settled (0: none).
func (p *partition) inflightEnd() int {
	inflight := p.inflight
	if p.voided != "" {
		inflight = max(inflight, p.voidSpan)
	}
	n := 0
	for i, it := range p.queue {
		if n == inflight {
			return i
		}
		if !it.skip() {
			n++
		}
	}
	return len(p.queue)
}

// windowRecordAge is how old a batch's newest record may be for the
// window to widen past it: a broker forgets an idempotent producer whose
// last batch's newest timestamp is older than producer.id.expiration.ms
// (1 day by default, checked every 10 minutes; ProducerStateManager), and
// a broker that has forgotten it appends a batch at any sequence (fact
// 2), so a batch behind one it refused would land in its place.
const windowRecordAge = 10 * time.Minute

// windowAllowed reports whether a batch may be sent behind prev, which
// is in flight: the broker knows the producer now (a batch of this run
// was acknowledged, with recent records) and still will when the batch
// arrives, whatever becomes of prev (prev's records are recent too).
// Otherwise the partition sends one batch at a time.
func (p *partition) windowAllowed(prev *item, now time.Time) bool {
	oldest := now.Add(-windowRecordAge).UnixMilli()
	return p.acked && p.ackedMaxTs >= oldest && prev.batch.MaxTimestamp() >= oldest
}

// popSkips applies the skip items at the head of the queue (every
// batch before them is acknowledged).
func (p *partition) popSkips() {
	for len(p.queue) > 0 && p.queue[0].skip() {
		p.skipped(p.queue[0])
		p.queue = p.queue[1:]
	}
}

// ack applies a successful produce of the queue head at destination
// offset base.
func (p *partition) ack(it *item, base int64) {
	for i := 0; i < int(it.count); i++ {
		p.xl.Observe(it.sourceOffset(i), base+int64(i))
		if it.srcOffsets == nil {
			break // contiguous: the first record decides the whole batch
		}
	}
	p.pos.DestinationOffset = base + int64(it.count)
	p.pos.SourceOffset = it.srcNext
	p.pos.SourceLeaderEpoch = it.epoch
	if it.converted {
		p.convertedRecords += int64(it.count)
	}
	p.nextSeq = kwire.NextSequence(it.seq, it.count)
	p.xl.Advance(p.pos.SourceOffset, p.pos.DestinationOffset)
	p.dirty = true
}

// skipped applies a skip item at the queue head.
func (p *partition) skipped(it *item) {
	p.pos.SourceOffset = it.srcNext
	p.xl.Advance(p.pos.SourceOffset, p.pos.DestinationOffset)
	p.dirty = true
}

func (p *partition) status(now time.Time) Status {
	st := Status{Key: p.key(), State: p.reported(), Reason: p.reason, Position: p.pos, SourceEnd: p.srcEnd,
		DuplicateRecords: p.duplicateRecords, Duplicate: p.lastDuplicate, ConvertedRecords: p.convertedRecords}
	if p.mirroring() {
		var parts []string
		for _, s := range []string{p.fetchErr, p.produceErr, p.checkpointErr} {
			if s != "" {
				parts = append(parts, s)
			}
		}
		st.Retrying = strings.Join(parts, "; ")
	}
	if p.srcEnd >= 0 && p.srcEnd > p.pos.SourceOffset {
		st.Lag = p.srcEnd - p.pos.SourceOffset
	}
	lag := int64(-1) // the source's end not known yet
	if p.srcEnd >= 0 {
		lag = st.Lag
	}
	var head kwire.Batch
	if it := p.headBatch(); it != nil {
		head = it.batch
	}
	st.TimeLagMs = timeLagMs(now, lag, head)
	st.MirroredRecords, st.MirroredBytes = p.progress.records, p.progress.bytes
	st.RecordsPerSec, st.BytesPerSec = p.progress.rates(now)
	st.CheckpointFailing = p.checkpointErr != ""
	st.Throttled = p.throttled
	st.SourceAnswered = p.srcAnswered
	st.SourceAsked = p.srcAsked
	if p.send == sendInflight {
		st.SentAt = p.sentAt
	}
	st.DestinationUnanswered = p.dstUnanswered
	st.TranslationEntries, st.TranslationBytes, st.TranslationFloor = p.xl.Len(), p.xl.Bytes(), p.xl.Floor()
	if p.mirroring() && p.srcEnd >= 0 && p.srcHW > p.srcEnd && p.pos.SourceOffset >= p.srcEnd {
		st.Waiting = fmt.Sprintf("waiting for an open source transaction: source offsets %d..%d are not committed yet "+
			"(read_committed mirrors up to the last stable offset %d)", p.srcEnd, p.srcHW-1, p.srcEnd)
	}
	return st
}
