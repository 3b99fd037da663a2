package raftstore

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// errIsolated refuses raft connections while the isolation test hook is on.
var errIsolated = errors.New("raft traffic of this member is cut by the isolation test hook")

// streamLayer is raft's TCP stream layer, listening on one address and
// advertising another, with a switch that cuts this member's raft traffic
// (a test hook: SetIsolated).
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	cut       atomic.Bool

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func newStreamLayer(bind string, advertise net.Addr) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	return &streamLayer{ln: ln, advertise: advertise, conns: map[*trackedConn]struct{}{}}, nil
}

// Dial implements raft.StreamLayer.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.cut.Load() {
		return nil, errIsolated
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return s.track(c), nil
}

// Accept implements net.Listener; while cut, incoming connections are
// closed at once.
func (s *streamLayer) Accept() (net.Conn, error) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return nil, err
		}
		if s.cut.Load() {
			c.Close()
			continue
		}
		return s.track(c), nil
	}
}

func (s *streamLayer) Close() error   { return s.ln.Close() }
func (s *streamLayer) Addr() net.Addr { return s.advertise }

// setCut turns the isolation on (closing every open raft connection) or off.
func (s *streamLayer) setCut(on bool) {
	s.cut.Store(on)
	if !on {
		return
	}
	s.mu.Lock()
	open := make([]*trackedConn, 0, len(s.conns))
	for c := range s.conns {
		open = append(open, c)
	}
	s.mu.Unlock()
	for _, c := range open {
		c.Close()
	}
}

func (s *streamLayer) track(c net.Conn) net.Conn {
	tc := &trackedConn{Conn: c, s: s}
	s.mu.Lock()
	s.conns[tc] = struct{}{}
	s.mu.Unlock()
	return tc
}

type trackedConn struct {
	net.Conn
	s *streamLayer
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.conns, c)
	c.s.mu.Unlock()
	return c.Conn.Close()
}
