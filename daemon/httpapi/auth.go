package httpapi

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
)

// fileCache re-reads a file when its modification time or size changes.
type fileCache[T any] struct {
	mu    sync.Mutex
	paths []string
	load  func() (T, error)
	stamp string
	val   T
}

func (c *fileCache[T]) get() (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var stamp strings.Builder
	for _, p := range c.paths {
		fi, err := os.Stat(p)
		if err != nil {
			var zero T
			return zero, err
		}
		fmt.Fprintf(&stamp, "%s/%d/%d;", p, fi.ModTime().UnixNano(), fi.Size())
	}
	if stamp.String() == c.stamp {
		return c.val, nil
	}
	v, err := c.load()
	if err != nil {
		return v, err
	}
	c.stamp, c.val = stamp.String(), v
	return v, nil
}

// Auth is this member's view of the API's security, as a server and as
// a client of the other members. A nil *Auth is plain HTTP without a
// token.
type Auth struct {
	cfg   config.APIConfig
	token *fileCache[[]string]
	// unauthorized counts requests refused for their token
	// (kmirror_api_unauthorized_total); lastWarn rate-limits the logs of
	// refusals and of peers that refuse this member.
	unauthorized atomic.Int64
	warnMu       sync.Mutex
	lastWarn     map[string]time.Time
	cert         *fileCache[*tls.Certificate]
	// client calls other members: TLS when the API is TLS, with CAFile.
	clientTLS *tls.Config
	// transport carries every call this member makes to the others, so
	// they share pooled connections (memberTransport).
	transport *http.Transport
	// self is this member's node_id, sent as api.MemberHeader.
	self string
	log  *zap.Logger
}

// NewAuth returns the API security of member self (its node_id) from the
// api section; errors name the file that cannot be used.
func NewAuth(cfg config.APIConfig, self string, log *zap.Logger) (*Auth, error) {
	a := &Auth{cfg: cfg, self: self, log: log}
	if cfg.TokenFile != "" {
		a.token = &fileCache[[]string]{paths: []string{cfg.TokenFile}, load: func() ([]string, error) { return config.ReadTokens(cfg.TokenFile) }}
	}
	if cfg.TLS.CertFile != "" {
		a.cert = &fileCache[*tls.Certificate]{paths: []string{cfg.TLS.CertFile, cfg.TLS.KeyFile}, load: func() (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
			return &c, err
		}}
		a.clientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLS.CAFile != "" {
			pool, err := config.CertPool(cfg.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("api.tls.ca_file: %w", err)
			}
			a.clientTLS.RootCAs = pool
		}
	}
	a.transport = memberTransport(a.clientTLS)
	if a.cert != nil && self != "" {
		if c, err := a.cert.get(); err == nil && len(c.Certificate) > 0 {
			if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && leaf.Subject.CommonName != self {
				log.Warn("the API certificate's common name is not this member's node_id: on member routes it speaks for any member "+
					"whose HTTP host it holds; give each member a certificate with CN=<node_id> to tell members apart (README, Security)",
					zap.String("common_name", leaf.Subject.CommonName), zap.String("node_id", self))
			}
		}
	}
	if a.cert != nil {
		// A member presents its API certificate to the others: its
		// identity on member routes (Identify).
		a.transport.TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return a.cert.get()
		}
	}
	return a, nil
}

// Bounds of the connections one member keeps to each other member.
const (
	// MaxConnsPerMember bounds the connections to one member, in use or
	// idle; a call beyond it waits for one.
	MaxConnsPerMember = 32
	// maxIdlePerMember bounds the idle ones kept for reuse.
	maxIdlePerMember = 8
	// memberIdleTimeout closes a pooled connection idle this long (below
	// the server's IdleTimeout, so the client closes first).
	memberIdleTimeout = 30 * time.Second
)

// plainTransport carries the calls of members without an Auth (plain
// HTTP, no token).
var plainTransport = memberTransport(nil)

// memberTransport is the one transport a member calls the others with:
// TLS with tlsConfig when set, connections pooled and bounded per member.
func memberTransport(tlsConfig *tls.Config) *http.Transport {
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		MaxConnsPerHost:       MaxConnsPerMember,
		MaxIdleConnsPerHost:   maxIdlePerMember,
		IdleConnTimeout:       memberIdleTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 0, // long calls (remove --wait) answer late; the client's timeout bounds them
	}
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig.Clone()
	}
	return t
}

// Transport is the shared transport of this member's calls to the others.
func (a *Auth) Transport() *http.Transport {
	if a == nil {
		return plainTransport
	}
	return a.transport
}

// Scheme is how members reach each other's API.
func (a *Auth) Scheme() string {
	if a != nil && a.cert != nil {
		return "https://"
	}
	return "http://"
}

// ServerTLS is the API server's TLS configuration (nil: plain HTTP). The
// certificate files are read again when they change.
func (a *Auth) ServerTLS() *tls.Config {
	if a == nil || a.cert == nil {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return a.cert.get()
	},
		// Members present their API certificates; Identify verifies them
		// (any key usage: API certificates are often server-only).
		ClientAuth: tls.RequestClientCert}
}

// CurrentToken is the token members send each other: the file's first
// line ("" when none).
func (a *Auth) CurrentToken() string {
	if a == nil || a.token == nil {
		return ""
	}
	t, err := a.token.get() // an unreadable file is reported by the server side
	if err != nil || len(t) == 0 {
		return ""
	}
	return t[0]
}

// warnEvery logs at most one warning per key and interval.
func (a *Auth) warnEvery(key string, msg string, fields ...zap.Field) {
	a.warnMu.Lock()
	defer a.warnMu.Unlock()
	if a.lastWarn == nil {
		a.lastWarn = map[string]time.Time{}
	}
	if time.Since(a.lastWarn[key]) < 10*time.Second {
		return
	}
	a.lastWarn[key] = time.Now()
	a.log.Warn(msg, fields...)
}

// PeerFailed logs, with the peer's ID, a member that refused this one's
// API call for a reason no retry fixes: its token or TLS settings differ.
func (a *Auth) PeerFailed(id string, err error) {
	if a == nil || (!errors.Is(err, api.ErrUnauthorized) && !strings.Contains(err.Error(), "certificate")) {
		return
	}
	a.warnEvery("peer "+id, "a member refused this member's API call: the api settings (token_file, tls.ca_file, the API certificate's hosts) must suit every member",
		zap.String("member", id), zap.Error(err))
}

// Require wraps h: every route except the open ones needs the bearer
// token. A missing or wrong token is answered 401 with what to do, and the
// request does nothing.
func (a *Auth) Require(h http.Handler) http.Handler {
	h = a.Identify(h)
	if a == nil || a.token == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if slices.Contains(a.cfg.OpenRoutes, r.URL.Path) {
			h.ServeHTTP(w, r)
			return
		}
		want, err := a.token.get()
		if err != nil {
			a.warnEvery("token file", "this member cannot read api.token_file: it refuses every API request until the file is fixed", zap.Error(err))
			writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{Code: "not_leader", Error: "this member cannot read its api.token_file (fix the file on the member); ask another member"})
			return
		}
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got = strings.TrimSpace(got)
		ui := r.URL.Path == "/ui"
		if _, pw, ok := r.BasicAuth(); ok && ui {
			// A browser sends the token as the password of HTTP Basic
			// authentication (any user name): it cannot add a bearer
			// header to a page it navigates to.
			scheme, got = "Bearer", pw
		}
		valid := slices.ContainsFunc(want, func(t string) bool { return subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 })
		if !valid {
			a.unauthorized.Add(1)
			a.warnEvery("unauthorized", "API request refused: no or a wrong bearer token (counted in kmirror_api_unauthorized_total)",
				zap.String("remote", r.RemoteAddr), zap.String("method", r.Method), zap.String("path", r.URL.Path))
		}
		switch {
		case ui && !valid:
			w.Header().Set("WWW-Authenticate", `Basic realm="kmirror status: the API token as the password", charset="UTF-8"`)
			http.Error(w, "kmirror's status page needs the API token: give it as the password (any user name); "+
				"it is in the file named by api.token_file on the members", http.StatusUnauthorized)
		case !strings.EqualFold(scheme, "Bearer") || got == "":
			w.Header().Set("WWW-Authenticate", `Bearer realm="kmirror"`)
			writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Code: "unauthorized", Error: "this kmirror API needs a bearer token: pass --token-file FILE (or KMIRROR_TOKEN_FILE) " +
				"to the CLI, or send Authorization: Bearer <token>; the token is in the file named by api.token_file on the members"})
		case !valid:
			w.Header().Set("WWW-Authenticate", `Bearer realm="kmirror", error="invalid_token"`)
			writeJSON(w, http.StatusUnauthorized, api.ErrorBody{Code: "unauthorized", Error: "the bearer token is not this kmirror group's: check --token-file (or KMIRROR_TOKEN_FILE) against api.token_file on the members"})
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// TokenRequired reports whether API requests need the bearer token.
func (a *Auth) TokenRequired() bool { return a != nil && a.token != nil }

// UnauthorizedTotal counts the requests refused for their token.
func (a *Auth) UnauthorizedTotal() int64 { return a.unauthorized.Load() }

// ClientFor returns a client of the API at addr (host:port) as this member
// calls it.
func (a *Auth) ClientFor(addr string, timeout time.Duration) (*api.Client, error) {
	c, err := api.NewClient(a.Scheme()+addr, timeout)
	if err != nil {
		return nil, err
	}
	c = c.WithTransport(a.Transport(), a.CurrentToken())
	if a != nil && a.self != "" {
		c = c.AsMember(a.self)
	}
	return c, nil
}

// Identify records who sent each request (api.CallerOf): the member it
// names (api.MemberHeader) and, over TLS, its client certificate if it
// verifies against api.tls.ca_file (the system's CAs without one).
func (a *Auth) Identify(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := api.Caller{Member: r.Header.Get(api.MemberHeader), TLS: r.TLS != nil}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			c.Cert = a.verifyClient(r.TLS.PeerCertificates)
		}
		h.ServeHTTP(w, r.WithContext(api.WithCaller(r.Context(), c)))
	})
}

// verifyClient returns the leaf of a client's chain if it verifies, else
// nil.
func (a *Auth) verifyClient(chain []*x509.Certificate) *x509.Certificate {
	opts := x509.VerifyOptions{Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if a != nil && a.clientTLS != nil {
		opts.Roots = a.clientTLS.RootCAs
	}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return nil
	}
	return chain[0]
}

// HTTPClient is an http.Client for raw member-to-member calls, on the
// shared transport.
func (a *Auth) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: a.Transport()}
}

func (a *Auth) ProbePeer(ctx context.Context, client *http.Client, addr string) (api.RaftProbe, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.Scheme()+addr+"/v1/internal/raft", nil)
	if err != nil {
		return api.RaftProbe{}, err
	}
	if tok := a.CurrentToken(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return api.RaftProbe{}, err
	}
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) //nolint:errcheck // frees the connection for reuse
		resp.Body.Close()
	}()
	if resp.StatusCode != http.StatusOK {
		return api.RaftProbe{}, fmt.Errorf("%s answered %s", addr, resp.Status)
	}
	var pr api.RaftProbe
	if err := json.NewDecoder(resp.Body).Decode(&pr); err != nil {
		return api.RaftProbe{}, fmt.Errorf("%s: %w", addr, err)
	}
	return pr, nil
}
