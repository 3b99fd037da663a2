package httpapi

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Server bounds (issue 18: idle keep-alive connections were never closed,
// and one client filled a member's file descriptors).
const (
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout = 60 * time.Second
	// ReadHeaderTimeout bounds the TLS handshake and the request headers.
	ReadHeaderTimeout = 10 * time.Second
	// readTimeout bounds reading a whole request (bodies are small JSON).
	readTimeout = 30 * time.Second
	// MaxConnsPerClient bounds the connections one client address (IP)
	// holds open at once. A new connection beyond it closes that client's
	// longest-idle keep-alive connection, or, when none is idle, is
	// closed at accept. Members use at most MaxConnsPerMember each.
	MaxConnsPerClient = 128
	// MaxConns bounds the connections open at once from all clients
	// (far below deploy/kmirror.service's LimitNOFILE=65536); beyond it
	// the longest-idle connection of any client is closed, or the new one.
	MaxConns = 4096
	// maxHeaderBytes bounds a request's headers.
	maxHeaderBytes = 64 << 10
)

// NewServer is the member's HTTP server for handler, with the bounds
// above. Serve it on Limit(listener) and set its ConnState to the
// limiter's Track, so idle connections can be told from busy ones.
func NewServer(handler http.Handler, log *zap.Logger) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       readTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// The server's own errors (TLS handshakes refused) as JSON log
		// lines like the rest.
		ErrorLog: zap.NewStdLog(log),
	}
}

// ConnLimiter is a listener that holds at most perClient connections open
// per client IP and maxTotal in all. A connection beyond a bound takes the
// place of one within it that does no work (victimRank): idle between
// requests, or not past its request headers (closed; an HTTP client
// retries a request it had not sent on it), so one client holding idle or
// slow connections never locks out another request, a probe from the same
// address included (issue 18). When every connection within the bound is
// serving a request, the new one is closed at accept and counted
// (kmirror_api_connections_refused_total).
type ConnLimiter struct {
	net.Listener
	perClient, maxTotal int
	log                 *zap.Logger
	grace               atomic.Int64 // NewConnGrace, ns (tests change it)

	mu      sync.Mutex
	conns   map[string]map[*limitedConn]struct{} // open connections by client IP
	total   atomic.Int64
	refused atomic.Int64
	evicted atomic.Int64
	warned  atomic.Int64 // unix seconds of the last warning
}

// Limit wraps ln with a bound of perClient open connections per client IP
// and maxTotal in all (the member: MaxConnsPerClient, MaxConns).
func Limit(ln net.Listener, perClient, maxTotal int, log *zap.Logger) *ConnLimiter {
	l := &ConnLimiter{Listener: ln, perClient: perClient, maxTotal: maxTotal, log: log, conns: map[string]map[*limitedConn]struct{}{}}
	l.grace.Store(int64(NewConnGrace))
	return l
}

// Accept returns the next connection within the bounds, closing a
// longest-idle one to make room; a connection no room can be made for is
// closed here.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientIP(c.RemoteAddr())
		lc := &limitedConn{Conn: c, l: l, ip: ip, fresh: true, acceptedAt: time.Now()}
		l.mu.Lock()
		var victim *limitedConn
		ok := true
		grace := time.Duration(l.grace.Load())
		switch {
		case len(l.conns[ip]) >= l.perClient:
			victim, _ = pickVictim(l.conns[ip], grace)
			ok = victim != nil
		case int(l.total.Load()) >= l.maxTotal:
			var best victimRank
			for _, cs := range l.conns {
				if v, r := pickVictim(cs, grace); v != nil && (victim == nil || r.before(best)) {
					victim, best = v, r
				}
			}
			ok = victim != nil
		}
		if victim != nil {
			l.forgetLocked(victim) // its slot is the new connection's now
		}
		if ok {
			if l.conns[ip] == nil {
				l.conns[ip] = map[*limitedConn]struct{}{}
			}
			l.conns[ip][lc] = struct{}{}
			l.total.Add(1)
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Conn.Close()
			l.evicted.Add(1)
		}
		if ok {
			return lc, nil
		}
		c.Close()
		l.refused.Add(1)
		if now := time.Now().Unix(); l.warned.Swap(now) < now-60 {
			l.log.Warn("API connection refused: the most connections allowed are open and all are busy; "+
				"a client opens connections and does not close them (or many clients share one address)",
				zap.String("client", ip), zap.Int("max_connections_per_client", l.perClient), zap.Int("max_connections", l.maxTotal))
		}
	}
}

// NewConnGrace is how long a new connection may take to complete its TLS
// handshake and request headers before it counts as slow: a real client
// takes milliseconds; one that sends a header line a second (slowloris)
// holds its slot up to ReadHeaderTimeout otherwise, and a few hundred of
// them locked probes and the members' lease renewals out (issue 18).
const NewConnGrace = time.Second

// victimRank orders the connections that may give their place to a new
// one: first those idle between requests or new and slow (past the
// grace), the longest waiting first; then new ones within the grace, the
// oldest first (a real client is past its headers within milliseconds,
// while connections that keep arriving and never send them are older).
// A connection serving a request never gives its place.
type victimRank struct {
	withinGrace bool
	since       time.Time
}

func (r victimRank) before(o victimRank) bool {
	if r.withinGrace != o.withinGrace {
		return !r.withinGrace
	}
	return r.since.Before(o.since)
}

// pickVictim returns the connection of cs that gives its place first
// (victimRank), nil when every one is serving a request.
func pickVictim(cs map[*limitedConn]struct{}, grace time.Duration) (*limitedConn, victimRank) {
	var v *limitedConn
	var best victimRank
	now := time.Now()
	for c := range cs {
		var r victimRank
		switch {
		case !c.idleSince.IsZero():
			r = victimRank{since: c.idleSince}
		case c.fresh:
			r = victimRank{withinGrace: now.Sub(c.acceptedAt) < grace, since: c.acceptedAt}
		default:
			continue
		}
		if v == nil || r.before(best) {
			v, best = c, r
		}
	}
	return v, best
}

// Track is the http.Server's ConnState hook: it marks a connection idle
// (between requests of a keep-alive connection) or busy, for the choice of
// the connection to close when a bound is reached.
func (l *ConnLimiter) Track(c net.Conn, state http.ConnState) {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // a TLS connection over the limiter's
		c = nc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lc.fresh = state == http.StateNew
	if state == http.StateIdle {
		lc.idleSince = time.Now()
	} else {
		lc.idleSince = time.Time{}
	}
}

// Open is the number of connections open now.
func (l *ConnLimiter) Open() int64 { return l.total.Load() }

// Refused counts the connections closed at accept for a bound.
func (l *ConnLimiter) Refused() int64 { return l.refused.Load() }

// Evicted counts the idle connections closed to make room for a new one.
func (l *ConnLimiter) Evicted() int64 { return l.evicted.Load() }

// forgetLocked takes c out of the count once (Close or eviction).
func (l *ConnLimiter) forgetLocked(c *limitedConn) {
	cs := l.conns[c.ip]
	if _, ok := cs[c]; !ok {
		return
	}
	delete(cs, c)
	if len(cs) == 0 {
		delete(l.conns, c.ip)
	}
	l.total.Add(-1)
}

type limitedConn struct {
	net.Conn
	l  *ConnLimiter
	ip string
	// idleSince is when the server last found the connection idle
	// between requests; zero while it is new or serving one. fresh: it
	// has not completed its first request's headers yet (accepted at
	// acceptedAt). Under l.mu.
	idleSince  time.Time
	fresh      bool
	acceptedAt time.Time
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return err
}

func clientIP(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return a.String()
}
