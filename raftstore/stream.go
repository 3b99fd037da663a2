package raftstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/zap"
)

// errIsolated refuses raft connections while the isolation test hook is on.
var errIsolated = errors.New("raft traffic of this member is cut by the isolation test hook")

// streamLayer is raft's TCP stream layer, listening on one address and
// advertising another, with a switch that cuts this member's raft traffic
// (a test hook: SetIsolated), and optional mutual TLS.
type streamLayer struct {
	ln        net.Listener
	advertise net.Addr
	cut       atomic.Bool
	tls       *TLS
	log       *zap.Logger

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
	// dialErrs holds, per member address, why the last connection this
	// member dialed to it failed: the dial, the TLS handshake, or a read
	// (the member's TLS alert: with TLS 1.3 the client's handshake ends
	// before the server has checked the client's certificate; or a
	// heartbeat's read timeout). Data read from the member clears it.
	// nDialErrs is len(dialErrs), read without the lock on every read.
	dialErrs  map[raft.ServerAddress]error
	nDialErrs atomic.Int32
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// TLS is mutual TLS between members: every raft connection presents a
// certificate the other side's CA pool verifies, so a process without a
// certificate from the members' CA cannot join the group or send it raft
// messages (votes, appends) that disturb it.
type TLS struct {
	// Server accepts connections: Certificates, ClientCAs and
	// ClientAuth=RequireAndVerifyClientCert.
	Server *tls.Config
	// Client dials members: Certificates and RootCAs; ServerName is set
	// to the dialed host, which the member's certificate must hold.
	Client *tls.Config
}

func newStreamLayer(bind string, advertise net.Addr, t *TLS, log *zap.Logger) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, err
	}
	return &streamLayer{ln: ln, advertise: advertise, tls: t, log: log, conns: map[*trackedConn]struct{}{},
		dialErrs: map[raft.ServerAddress]error{}}, nil
}

// Dial implements raft.StreamLayer. With TLS, the handshake completes
// within timeout before raft gets the connection.
func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if s.cut.Load() {
		return nil, errIsolated
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		s.setDialErr(addr, fmt.Errorf("raft connection to member %s: %w (is it running, listening on that raft address?)", addr, err))
		return nil, err
	}
	if s.tls != nil {
		cfg := s.tls.Client.Clone()
		if host, _, err := net.SplitHostPort(string(addr)); err == nil && cfg.ServerName == "" {
			cfg.ServerName = host
		}
		tc := tls.Client(c, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			err = fmt.Errorf("raft TLS handshake with member %s: %w (%s)", addr, err, handshakeHint(err))
			s.setDialErr(addr, err)
			return nil, err
		}
		c = tc
	}
	return s.track(&dialedConn{Conn: c, addr: addr, s: s}), nil
}

func (s *streamLayer) setDialErr(addr raft.ServerAddress, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		delete(s.dialErrs, addr)
	} else {
		s.dialErrs[addr] = err
	}
	s.nDialErrs.Store(int32(len(s.dialErrs)))
}

// handshakeHint says what a failed client handshake most likely means.
func handshakeHint(err error) string {
	switch {
	case isTimeout(err):
		return connHint(err) + "; not a certificate problem"
	case isClosed(err):
		return "the member closed the connection: is raft_tls set on it too? Every member needs the same raft_tls settings"
	}
	return "raft_tls: the member's certificate must be signed by ca_file and hold the host it is dialed by"
}

// connHint says what a failed read on a raft connection most likely means.
func connHint(err error) string {
	switch {
	case isTimeout(err):
		return "no answer in time: the member is overloaded, stopped (SIGSTOP) or cut off"
	case isClosed(err):
		return "the member closed the connection: it restarted or stopped"
	}
	return "see the member's log"
}

func isTimeout(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout())
}

func isClosed(err error) bool { return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) }

// dialErr returns why the last connection to addr failed, or nil.
func (s *streamLayer) dialErr(addr raft.ServerAddress) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dialErrs[addr]
}

// dialedConn is a connection this member dialed. Data from the member
// clears its recorded error; a failed read records why (see
// streamLayer.dialErrs).
type dialedConn struct {
	net.Conn
	addr raft.ServerAddress
	s    *streamLayer
}

func (c *dialedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.s.nDialErrs.Load() > 0 {
		c.s.setDialErr(c.addr, nil)
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		c.s.setDialErr(c.addr, readError(c.addr, err))
	}
	return n, err
}

// readError words a failed read on a raft connection to addr.
func readError(addr raft.ServerAddress, err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "remote error" { // a TLS alert from the member
		return fmt.Errorf("raft connection to member %s refused by it: %w "+
			"(raft_tls: its ca_file must hold the CA that signed the dialing member's raft certificate)", addr, err)
	}
	return fmt.Errorf("raft connection to member %s: %w (%s)", addr, err, connHint(err))
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
		if s.tls != nil {
			// The handshake runs on raft's per-connection goroutine (at
			// the first read), not here, so one slow peer cannot hold up
			// the others; a refused peer is logged there.
			c = &serverTLSConn{Conn: tls.Server(c, s.tls.Server), log: s.log}
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

// serverTLSConn completes the server side of the TLS handshake at first
// use and logs a refused peer once.
type serverTLSConn struct {
	net.Conn // *tls.Conn
	log      *zap.Logger
	once     sync.Once
	err      error
}

func (c *serverTLSConn) handshake() error {
	c.once.Do(func() {
		tc := c.Conn.(*tls.Conn)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if c.err = tc.HandshakeContext(ctx); c.err != nil && c.log != nil {
			c.log.Warn("raft connection refused: TLS handshake failed (a peer without a certificate from raft_tls.ca_file?)",
				zap.String("remote", c.RemoteAddr().String()), zap.Error(c.err))
		}
	})
	return c.err
}

func (c *serverTLSConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *serverTLSConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
