package harness

import (
	"net"
	"sync"
	"time"
)

// relays is what Proxy and DelayProxy share: a listener in front of one
// target, and the connections relayed through it, closed together by
// close.
type relays struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

func newRelays(ln net.Listener, target string) relays {
	return relays{ln: ln, target: target, conns: map[net.Conn]bool{}}
}

// acceptEach accepts clients until the listener closes; each one is
// relayed by serve (after onAccept, when set) to its own connection to the
// target, and both are closed once serve returns.
func (r *relays) acceptEach(onAccept func(), serve func(client, target net.Conn)) {
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		if onAccept != nil {
			onAccept()
		}
		go func() {
			target, err := net.DialTimeout("tcp", r.target, 10*time.Second)
			if err != nil {
				client.Close()
				return
			}
			if !r.track(client, target) {
				client.Close()
				target.Close()
				return
			}
			defer r.untrack(client, target)
			serve(client, target)
		}()
	}
}

// track adds connections; false once the relays are closed.
func (r *relays) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for _, c := range cs {
		r.conns[c] = true
	}
	return true
}

// untrack closes connections and forgets them.
func (r *relays) untrack(cs ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(r.conns, c)
	}
}

// isClosed reports whether close was called.
func (r *relays) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// close stops accepting and closes every relayed connection.
func (r *relays) close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	return r.ln.Close()
}
