package fetch

import (
	"time"

	"go.uber.org/zap"
)

// Fetch connections per source broker: how many, from the round trip
// the kernel measures (issue 20).

// maxFetchConns bounds the fetch loops per source broker.
const maxFetchConns = 8

// bulkAnswer is the least answer (bytes of records) after which the
// receive side's round-trip estimate is fresh (kwire.Conn.RTT): dozens
// of full-sized segments even at a 64 KiB MSS.
const bulkAnswer = 4 << 20

// resizeEvery is how often a source broker's first fetch loop sizes its
// fetch loops again from the round trip the kernel keeps measuring.
const resizeEvery = time.Second

// fetchConnsFor is how many fetch connections a source broker at round
// trip rtt gets: one per 5 ms, up to maxFetchConns. Each connection has
// one fetch in flight (a fetch session answers one request at a time), so
// a connection moves at most its fetch size per round trip, and no more
// than the source broker's send buffer (socket.send.buffer.bytes, Kafka's
// default 100 KiB) per round trip whatever the fetch size: across 50 ms
// that is about 4 MB/s. Several connections over disjoint partitions keep
// more of the bandwidth-delay product in flight (issue 20); on a LAN one
// is enough. One per 5 ms gives a 50 ms link the most: with one per 10 ms
// (6 at 50 ms), 8 partitions shared 6 fetches, and the two that
// shared one fetch ran at half the speed of the others (bench --rtt 50ms).
func fetchConnsFor(rtt time.Duration) int {
	return min(1+int(rtt/(5*time.Millisecond)), maxFetchConns)
}

// fetchSlot is the fetch loop (of conns) that fetches partition k: spread
// by partition number, offset per topic.
// It runs for every partition at every fetch: FNV-1a over the topic,
// without a hasher or a copy of the name.
func fetchSlot(k Key, conns int) int {
	if conns <= 1 {
		return 0
	}
	h := uint32(2166136261)
	for i := 0; i < len(k.Topic); i++ {
		h = (h ^ uint32(k.Topic[i])) * 16777619
	}
	return int((h + uint32(k.Partition)) % uint32(conns))
}

// connSizer turns the round trips read on a broker's first fetch
// connection into a count of fetch loops, steadily: a bulk reading (the
// receive side's, kwire.Conn.RTT) is kept for bulkRTTKeep, since the next
// small answer reads tcpi_min_rtt, which only drops and so misses a path
// that grew; and the count drops only after lowerAfter readings in a row
// ask for fewer (each drop and rise moves partitions between loops).
type connSizer struct {
	bulk   time.Duration // the last bulk reading
	bulkAt time.Time
	lower  int // readings in a row that asked for fewer loops than now
}

const (
	bulkRTTKeep = 30 * time.Second
	lowerAfter  = 3
)

// conns returns the loop count for a reading rtt taken at now (bulk: just
// after a bulk answer) while the broker has current loops (0: not sized).
func (s *connSizer) conns(now time.Time, rtt time.Duration, bulk bool, current int) (n int, used time.Duration) {
	if bulk {
		s.bulk, s.bulkAt = rtt, now
	} else if now.Sub(s.bulkAt) < bulkRTTKeep {
		rtt = max(rtt, s.bulk)
	}
	n = fetchConnsFor(rtt)
	if current > 0 && n < current {
		if s.lower++; s.lower < lowerAfter {
			return current, rtt
		}
	}
	s.lower = 0
	return n, rtt
}

// sizeFetchConns sets how many fetch loops source broker w.broker gets
// from the round trip rtt measured on the first loop's connection (bulk:
// just after a bulk answer; sizer keeps the readings), and starts or ends
// loops to match.
func (e *Engine) sizeFetchConns(mirror string, src *source, w *worker, sizer *connSizer, rtt time.Duration, bulk bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n, rtt := sizer.conns(time.Now(), rtt, bulk, src.measured[w.broker])
	if src.measured[w.broker] == n || e.sources[mirror] != src {
		return
	}
	src.measured[w.broker] = n
	if src.conns == 0 {
		e.log.Info("fetch connections to a source broker sized from its round trip",
			zap.String("mirror", mirror), zap.String("broker", w.addr), zap.Duration("rtt", rtt), zap.Int("connections", n))
		e.respreadLocked(mirror, src)
	}
}

// respreadLocked matches every source broker's fetch loops to its count
// (source.fetchConns): missing ones start, those beyond it exit at their
// next round (fetchWanted), and the partitions spread anew by fetchSlot.
func (e *Engine) respreadLocked(mirror string, src *source) {
	addrs := map[int32]string{}
	for key, f := range src.fetchers {
		addrs[key.broker] = f.addr
		kick(f.kick)
	}
	for broker, addr := range addrs {
		e.fetchersLocked(mirror, src, broker, addr, nil)
	}
}
