package fetch

import (
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// longPoll is how long a fetch loop's next fetch may wait at the broker:
// FetchMaxWait while records flow, doubling up to IdleFetchMaxWait while
// the session is idle (the last answer carried no records, the same
// partitions are asked for, nothing of them is queued), and up to
// busyFetchMaxWait while answers are empty but batches are queued.
type longPoll struct {
	idle  int           // idle answers in a row
	asked map[Key]bool  // the partitions of the last request
	last  time.Duration // the last request's wait
	held  bool          // the last request left out a partition with a full queue
}

// loopLoad is what a fetch loop's partitions have queued for produce.
type loopLoad struct {
	busy bool // one has batches queued
	// held: one is left out of the fetch because its queue is full
	// (fetchWanted's limit). It may ask again as soon as its queue
	// drains, which a fetch waiting at the broker for the others would
	// delay by up to FetchMaxWait: across a 50 ms round trip such waits
	// halved the copy rate (issue 20).
	held bool
}

// heldFetchMaxWait is the first wait of a fetch that leaves out a
// partition with a full queue; it doubles up to IdleFetchMaxWait while
// the answers stay empty (a queue that does not drain, a destination
// that is down, costs the broker few fetches: capped at the 100 ms
// FetchMaxWait it cost 10 fetches a second per loop).
const heldFetchMaxWait = 10 * time.Millisecond

// busyFetchMaxWait caps the wait of a loop whose partitions have batches
// queued while its answers stay empty: the 500 ms the fetch wait was
// before it became 100 ms (capped at FetchMaxWait, a slow destination
// cost the source 10 empty fetches a second per loop).
const busyFetchMaxWait = 500 * time.Millisecond

// wait returns the MaxWait of the next request for want.
func (l *longPoll) wait(cfg Config, want map[Key]fetchWant, load loopLoad) time.Duration {
	same := len(want) == len(l.asked)
	for k := range want {
		if !same {
			break
		}
		same = l.asked[k]
	}
	if !same {
		l.asked = make(map[Key]bool, len(want))
		for k := range want {
			l.asked[k] = true
		}
	}
	wasHeld := l.held
	l.held = load.held
	switch {
	case load.held && (!wasHeld || l.idle == 0):
		l.last = min(heldFetchMaxWait, cfg.FetchMaxWait)
	case load.held:
		l.last = min(2*l.last, max(cfg.IdleFetchMaxWait, cfg.FetchMaxWait))
	case load.busy && same && l.idle >= 2:
		// Batches queued, none arriving: a destination slower than the
		// source, not an idle session. Every partition is in the request,
		// so a longer wait delays nothing (the broker answers as soon as
		// records come); it only saves fetches of nothing.
		l.last = min(max(2*l.last, cfg.FetchMaxWait), max(busyFetchMaxWait, cfg.FetchMaxWait))
	case load.busy || !same || l.idle < 2:
		l.last = cfg.FetchMaxWait
	default:
		l.last = min(max(2*l.last, cfg.FetchMaxWait), max(cfg.IdleFetchMaxWait, cfg.FetchMaxWait))
	}
	return l.last
}

// answered counts an answer as idle when it carried no records.
func (l *longPoll) answered(res []kwire.FetchedPartition) {
	for _, fp := range res {
		if len(fp.Records) > 0 {
			l.idle = 0
			return
		}
	}
	l.idle++
}

func (l *longPoll) reset() { *l = longPoll{} }
