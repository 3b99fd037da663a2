package fetch

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// delayedConn delivers what its side writes d later, without holding the
// writer up: a link of one-way delay d in that direction, with no limit on
// what is in flight.
type delayedConn struct {
	net.Conn
	d    time.Duration
	q    chan delayedWrite
	once sync.Once
}

type delayedWrite struct {
	at   time.Time
	data []byte
}

func (c *delayedConn) Write(b []byte) (int, error) {
	c.once.Do(func() {
		go func() {
			for w := range c.q {
				time.Sleep(time.Until(w.at))
				if _, err := c.Conn.Write(w.data); err != nil {
					return
				}
			}
		}()
	})
	c.q <- delayedWrite{time.Now().Add(c.d), append([]byte(nil), b...)}
	return len(b), nil
}

// delayedListener makes every accepted connection's answers arrive d late.
type delayedListener struct {
	net.Listener
	d time.Duration
}

func (l delayedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &delayedConn{Conn: c, d: l.d, q: make(chan delayedWrite, 4096)}, nil
}

// BenchmarkProduceWindowOverADelayedDestination: one partition of
// single-record batches mirrored into a destination whose answers come
// 5 ms late (a destination a 5 ms round trip away), with a produce window
// of 1 and of 5. A window of 1 sends a partition's next batch only once
// the last is answered, so it is capped near one batch per round trip;
// the window keeps up to 5 in flight. It reports batches/s (b.N batches;
// kfake on both sides, so the figure is the engine's, not a broker's).
// Run: go test -run '^$' -bench ProduceWindow ./fetch/
func BenchmarkProduceWindowOverADelayedDestination(b *testing.B) {
	const rtt = 5 * time.Millisecond
	for _, window := range []int{1, MaxProduceWindow} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) {
			listen := kfake.ListenFn(func(network, addr string) (net.Listener, error) {
				ln, err := net.Listen(network, addr)
				if err != nil {
					return nil, err
				}
				return delayedListener{ln, rtt}, nil
			})
			x := newKfakePairDst(b, []kfake.Opt{listen}, func(c *Config) { c.ProduceWindow = window })
			x.createTopic("t", 1)
			for i := range b.N {
				x.produce(x.src, "t", i, 1)
			}
			b.ResetTimer()
			start := time.Now()
			x.e.Assign(specs("t", 1))
			deadline := time.Now().Add(10 * time.Minute)
			for !x.caughtUp("t", 1) {
				if time.Now().After(deadline) {
					b.Fatalf("not caught up after 10 minutes: %+v", x.e.Statuses())
				}
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "batches/s")
			b.ReportMetric(float64(rtt.Microseconds())/1000, "rtt-ms")
		})
	}
}
