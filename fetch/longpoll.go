package fetch

import (
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// longPoll is how long a fetch loop's next fetch may wait at the broker:
// FetchMaxWait while records flow, doubling up to IdleFetchMaxWait while
// the session is idle (the last answer carried no records, the same
// partitions are asked for, nothing of them is queued).
type longPoll struct {
	idle  int           // idle answers in a row
	asked map[Key]bool  // the partitions of the last request
	last  time.Duration // the last request's wait
}

// wait returns the MaxWait of the next request for want; busy: a
// partition of this loop has batches queued for produce.
func (l *longPoll) wait(cfg Config, want map[Key]fetchWant, busy bool) time.Duration {
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
	if busy || !same || l.idle < 2 {
		l.last = cfg.FetchMaxWait
	} else {
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
