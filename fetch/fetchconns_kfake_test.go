package fetch

import (
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestFetchConnectionsSplitPartitions: with three fetch connections to
// the source broker, three fetch loops each fetch their own share of the
// partitions (no partition in two loops' requests at once), and every
// record is mirrored once, in order (issue 20: one connection per broker
// cannot fill a long link).
func TestFetchConnectionsSplitPartitions(t *testing.T) {
	x := newKfakePair(t)
	x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), FetchConnections: 3})
	x.createTopic("t", 6)
	var mu sync.Mutex
	var requests [][]int32 // the partitions each fetch request named
	x.src.ControlKey(int16(kmsg.Fetch), func(r kmsg.Request) (kmsg.Response, error, bool) {
		x.src.KeepControl()
		var parts []int32
		for _, tp := range r.(*kmsg.FetchRequest).Topics {
			for _, p := range tp.Partitions {
				parts = append(parts, p.Partition)
			}
		}
		if len(parts) > 0 {
			mu.Lock()
			requests = append(requests, parts)
			mu.Unlock()
		}
		return nil, nil, false
	})
	x.produce(x.src, "t", 0, 1200)
	x.e.Assign(specs("t", 6))
	x.waitCaughtUp("t", 6)
	x.produce(x.src, "t", 1200, 1200)
	x.waitCaughtUp("t", 6)
	x.requireMirrored("t", 6)
	// What /metrics shows (kmirror_source_fetch_connections).
	for _, n := range x.e.FetchConnections()["m"] {
		if n != 3 {
			t.Fatalf("FetchConnections %v, want 3 for the source broker", x.e.FetchConnections())
		}
	}
	if len(x.e.FetchConnections()["m"]) != 1 {
		t.Fatalf("FetchConnections %v, want one source broker", x.e.FetchConnections())
	}

	mu.Lock()
	checked := requests
	requests = nil
	mu.Unlock()

	// The count changes while records stream (as an alter of
	// fetch.connections does): the partitions spread anew with none
	// lost or copied twice.
	for i, n := range []int{1, 3} {
		x.e.SetSource("m", Source{Bootstrap: x.src.ListenAddrs(), FetchConnections: n})
		// Loops beyond the count exit at their next round, after a long
		// poll at most.
		time.Sleep(2 * x.e.cfg.FetchMaxWait)
		x.produce(x.src, "t", 2400+i*600, 600)
		x.waitCaughtUp("t", 6)
	}
	x.requireMirrored("t", 6)

	seen, slots := map[int32]bool{}, map[int]bool{}
	for _, parts := range checked {
		slot := fetchSlot(Key{"m", "t", parts[0]}, 3)
		for _, p := range parts {
			seen[p] = true
			if s := fetchSlot(Key{"m", "t", p}, 3); s != slot {
				t.Fatalf("one fetch named partitions %v of different connections' shares (%d and %d)", parts, slot, s)
			}
		}
		slots[slot] = true
	}
	if len(slots) != 3 || len(seen) != 6 {
		t.Fatalf("fetches came for the shares %v and partitions %v: want all 3 shares and all 6 partitions", slots, seen)
	}
}

// TestFetchConnsForRoundTrip: one connection on a LAN, more as the round
// trip grows, never more than maxFetchConns.
func TestFetchConnsForRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		rtt  time.Duration
		want int
	}{{0, 1}, {200 * time.Microsecond, 1}, {4 * time.Millisecond, 1}, {5 * time.Millisecond, 2}, {20 * time.Millisecond, 5}, {50 * time.Millisecond, maxFetchConns}, {time.Second, maxFetchConns}} {
		if got := fetchConnsFor(tc.rtt); got != tc.want {
			t.Errorf("fetchConnsFor(%v) = %d, want %d", tc.rtt, got, tc.want)
		}
	}
}
