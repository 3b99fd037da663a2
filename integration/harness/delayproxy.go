package harness

import (
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"
)

// DelayProxy relays TCP between its clients and one target, holding what
// the target sends back for a set delay: a link slow in one direction.
// Bytes keep their order; what is held past a client's own timeout
// arrives late or, once the client gave up on the connection, never. It
// knows no protocol (raft's transport, for one).
type DelayProxy struct {
	relays
	delay atomic.Int64 // nanoseconds
}

// NewDelayProxy starts a DelayProxy on a free loopback port in front of
// target (host:port).
func NewDelayProxy(target string) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("harness: delay proxy listener: %w", err)
	}
	p := &DelayProxy{relays: newRelays(ln, target)}
	go p.acceptEach(nil, p.serve)
	return p, nil
}

// Addr is the address clients dial.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// SetReplyDelay holds every chunk the target sends for d from when it was
// read (0: passed at once; what is held already keeps its own delay).
func (p *DelayProxy) SetReplyDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Close stops the proxy and closes every connection through it.
func (p *DelayProxy) Close() error { return p.close() }

// chunk is what the target sent, and when it may go on.
type chunk struct {
	data []byte
	due  time.Time
}

func (p *DelayProxy) serve(client, target net.Conn) {
	go func() {
		io.Copy(target, client) //nolint:errcheck // either side closing ends the relay
		p.untrack(client, target)
	}()
	queue := make(chan chunk, 1024)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		defer p.untrack(client, target)
		for c := range queue {
			time.Sleep(time.Until(c.due))
			if _, err := client.Write(c.data); err != nil {
				return
			}
		}
	}()
	defer close(queue)
	buf := make([]byte, 64<<10)
	for {
		n, err := target.Read(buf)
		if n > 0 {
			select {
			case queue <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.delay.Load()))}:
			case <-stopped:
				return
			}
		}
		if err != nil {
			return
		}
	}
}
