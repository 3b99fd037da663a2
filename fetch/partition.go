package fetch

import (
	"fmt"
	"strings"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// partition is the engine's state for one leased partition. All fields are
// guarded by Engine.mu.
type partition struct {
	spec   Spec
	state  State
	reason string
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
	// fetchedEpoch is the source leader epoch of the last batch fetched
	// (at fetchOffset); -1 unknown. A new source leader is asked where it
	// ends (checkSourceTruncation).
	fetchedEpoch int32
	// outOfRange: the source answered OFFSET_OUT_OF_RANGE; fetching stops
	// while sourceOutOfRange decides.
	outOfRange bool
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
	inflight  bool
	// confirming: the head batch was sent and its outcome is unknown; it
	// is not sent again until confirm has read what the destination holds.
	confirming bool
	producer   kafka.ProducerID
	resumed    bool // producer, pos and translation are valid
	nextSeq    int32
	// own holds every producer identity this partition was written with
	// since its checkpoint (the current one, one replaced by a renewal)
	// and its next sequence, to tell late copies from foreign writes.
	own ownSeqs
	// renewing: the destination refused the producer identity and the
	// control plane is asked for a new epoch; nothing runs until it comes.
	renewing bool
	retryAt  time.Time
	failures int

	// Mirrored (acknowledged) progress and translation.
	pos   Position
	xl    Translation
	dirty bool

	// fetchErr and produceErr describe a retriable error the partition is
	// riding out (it stays MIRRORING); cleared by the next success.
	fetchErr   string
	produceErr string
	// checkpointErr is set while the partition's checkpoint cannot be
	// written; mirroring goes on (a crash then resumes from the last
	// written checkpoint with a longer walk).
	checkpointErr string

	// duplicateRecords counts records of kmirror's own batches found twice
	// on the destination since this member took the partition;
	// lastDuplicate describes the latest such batch.
	duplicateRecords int64
	lastDuplicate    string
	// idleSeen is the destination offset at the previous idle check when
	// the partition was idle then (-1 otherwise); see checkIdle.
	idleSeen int64

	draining bool
	released chan struct{} // closed when a drain completes
}

func (p *partition) key() Key { return p.spec.Key }

// active reports whether the data path works on the partition.
func (p *partition) active() bool { return p.state == Mirroring || p.state == Draining }

// wantsFetch reports whether the fetcher should ask for more data.
func (p *partition) wantsFetch(limit int64) bool {
	return p.state == Mirroring && !p.draining && !p.outOfRange && p.srcLeader >= 0 && p.queued < limit
}

// drained reports whether a draining partition has nothing left to send.
func (p *partition) drained() bool { return len(p.queue) == 0 && !p.inflight }

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

func (p *partition) status() Status {
	st := Status{Key: p.key(), State: p.state, Reason: p.reason, Position: p.pos, SourceEnd: p.srcEnd,
		DuplicateRecords: p.duplicateRecords, Duplicate: p.lastDuplicate}
	if p.state == Mirroring {
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
	st.CheckpointFailing = p.checkpointErr != ""
	st.TranslationEntries, st.TranslationBytes = p.xl.Len(), p.xl.Bytes()
	if p.state == Mirroring && p.srcEnd >= 0 && p.srcHW > p.srcEnd && p.pos.SourceOffset >= p.srcEnd {
		st.Waiting = fmt.Sprintf("waiting for an open source transaction: source offsets %d..%d are not committed yet "+
			"(read_committed mirrors up to the last stable offset %d)", p.srcEnd, p.srcHW-1, p.srcEnd)
	}
	return st
}
