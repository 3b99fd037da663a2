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
	// holds open at once; a connection beyond it is closed at accept.
	// Members use at most MaxConnsPerMember each.
	MaxConnsPerClient = 128
	// maxHeaderBytes bounds a request's headers.
	maxHeaderBytes = 64 << 10
)

// NewServer is the member's HTTP server for handler, with the bounds
// above. Serve it on Limit(listener).
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
// per client IP: a connection beyond it is closed as soon as it is
// accepted and counted (kmirror_api_connections_refused_total).
type ConnLimiter struct {
	net.Listener
	perClient int
	log       *zap.Logger

	mu      sync.Mutex
	open    map[string]int
	total   atomic.Int64
	refused atomic.Int64
	warned  atomic.Int64 // unix seconds of the last warning
}

// Limit wraps ln with a bound of perClient open connections per client IP.
func Limit(ln net.Listener, perClient int, log *zap.Logger) *ConnLimiter {
	return &ConnLimiter{Listener: ln, perClient: perClient, log: log, open: map[string]int{}}
}

// Accept returns the next connection within the bound; those beyond it
// are closed here.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := clientIP(c.RemoteAddr())
		l.mu.Lock()
		ok := l.open[ip] < l.perClient
		if ok {
			l.open[ip]++
		}
		l.mu.Unlock()
		if ok {
			l.total.Add(1)
			return &limitedConn{Conn: c, l: l, ip: ip}, nil
		}
		c.Close()
		l.refused.Add(1)
		if now := time.Now().Unix(); l.warned.Swap(now) < now-60 {
			l.log.Warn("API connection refused: this client already holds the most connections allowed; "+
				"it opens connections and does not close them (or shares one address with many clients)",
				zap.String("client", ip), zap.Int("max_connections_per_client", l.perClient))
		}
	}
}

// Open is the number of connections open now.
func (l *ConnLimiter) Open() int64 { return l.total.Load() }

// Refused counts the connections closed at accept for the bound.
func (l *ConnLimiter) Refused() int64 { return l.refused.Load() }

func (l *ConnLimiter) release(ip string) {
	l.total.Add(-1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[ip]--; l.open[ip] <= 0 {
		delete(l.open, ip)
	}
}

type limitedConn struct {
	net.Conn
	l    *ConnLimiter
	ip   string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}

func clientIP(a net.Addr) string {
	if tcp, ok := a.(*net.TCPAddr); ok {
		return tcp.IP.String()
	}
	return a.String()
}
