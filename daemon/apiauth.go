package daemon

import (
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
)

// APIConfig secures the HTTP API (config section api). Every member of a
// group uses the same settings: members call each other's API.
type APIConfig struct {
	TLS APITLSConfig `yaml:"tls"`
	// TokenFile holds the bearer token every request must carry
	// (Authorization: Bearer <token>), except to OpenRoutes. The file is
	// read again when it changes, so a token is rotated by replacing it
	// (on every member). Empty: no token.
	TokenFile string `yaml:"token_file"`
	// OpenRoutes are served without the token: any of /healthz, /readyz
	// and /metrics (all three by default, for orchestrators and
	// Prometheus).
	OpenRoutes []string `yaml:"open_routes"`
}

// APITLSConfig serves the API over TLS when CertFile is set.
type APITLSConfig struct {
	// CertFile and KeyFile are the server's certificate chain and private
	// key (PEM); read again when they change.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile holds the CA certificates (PEM) that sign the members' API
	// certificates, which members check when they call each other;
	// default: the system's CAs.
	CAFile string `yaml:"ca_file"`
}

// openableRoutes are the routes api.open_routes may name.
var openableRoutes = []string{"/healthz", "/readyz", "/metrics"}

// validate checks the api section; host is the host other members reach
// this member's API by ("" when not known), which the certificate must
// hold.
func (a APIConfig) validate(errs *problems, host string) {
	for i, r := range a.OpenRoutes {
		if !slices.Contains(openableRoutes, r) {
			errs.add(fmt.Sprintf("api.open_routes[%d]", i), "%q: only %s may be served without the token", r, strings.Join(openableRoutes, ", "))
		}
	}
	if a.TokenFile != "" {
		if _, err := readTokens(a.TokenFile); err != nil {
			errs.add("api.token_file", "%v", err)
		}
	}
	t := a.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs.add("api.tls", "set both cert_file and key_file (PEM), or neither")
	} else if t.CertFile != "" {
		if c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			errs.add("api.tls", "cert_file %s and key_file %s: %v", t.CertFile, t.KeyFile, err)
		} else if err := certHoldsHost(c, host); err != nil {
			errs.add("api.tls.cert_file", "%v: other members and the CLI reach this member's API at %s", err, host)
		}
	}
	if t.CAFile != "" && t.CertFile == "" {
		errs.add("api.tls", "ca_file is set but cert_file and key_file are not, so the API would be plain HTTP: set them too, or remove ca_file")
	}
	if t.CAFile != "" {
		if _, err := certPool(t.CAFile); err != nil {
			errs.add("api.tls.ca_file", "%v", err)
		}
	}
}

// minTokenLength is the shortest bearer token accepted (16 characters, as
// 8 random bytes in hex).
const minTokenLength = 16

// readTokens reads a token file: one token per line, the first sent to
// other members, every one accepted (two during a rotation). Errors name
// the file, never its content.
func readTokens(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%v: the token file must be readable by kmirror", err)
	}
	var toks []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if strings.ContainsAny(line, " \t") || len(line) < minTokenLength {
			return nil, fmt.Errorf("%s must hold one token per line, each of at least %d characters without spaces, such as the output of: openssl rand -hex 32",
				path, minTokenLength)
		}
		toks = append(toks, line)
	}
	if len(toks) == 0 || len(toks) > 2 {
		return nil, fmt.Errorf("%s must hold one token (or two, one per line, during a rotation: see README), such as the output of: openssl rand -hex 32", path)
	}
	return toks, nil
}

// certPool reads PEM CA certificates.
func certPool(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

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

// apiAuth is this member's view of the API's security, as a server and as
// a client of the other members. A nil *apiAuth is plain HTTP without a
// token.
type apiAuth struct {
	cfg   APIConfig
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
}

func newAPIAuth(cfg APIConfig) (*apiAuth, error) {
	a := &apiAuth{cfg: cfg}
	if cfg.TokenFile != "" {
		a.token = &fileCache[[]string]{paths: []string{cfg.TokenFile}, load: func() ([]string, error) { return readTokens(cfg.TokenFile) }}
	}
	if cfg.TLS.CertFile != "" {
		a.cert = &fileCache[*tls.Certificate]{paths: []string{cfg.TLS.CertFile, cfg.TLS.KeyFile}, load: func() (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
			return &c, err
		}}
		a.clientTLS = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.TLS.CAFile != "" {
			pool, err := certPool(cfg.TLS.CAFile)
			if err != nil {
				return nil, fmt.Errorf("api.tls.ca_file: %w", err)
			}
			a.clientTLS.RootCAs = pool
		}
	}
	return a, nil
}

// scheme is how members reach each other's API.
func (a *apiAuth) scheme() string {
	if a != nil && a.cert != nil {
		return "https://"
	}
	return "http://"
}

// serverTLS is the API server's TLS configuration (nil: plain HTTP). The
// certificate files are read again when they change.
func (a *apiAuth) serverTLS() *tls.Config {
	if a == nil || a.cert == nil {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		return a.cert.get()
	}}
}

// currentToken is the token members send each other: the file's first
// line ("" when none).
func (a *apiAuth) currentToken() string {
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
func (a *apiAuth) warnEvery(m *Member, key string, msg string, fields ...zap.Field) {
	a.warnMu.Lock()
	defer a.warnMu.Unlock()
	if a.lastWarn == nil {
		a.lastWarn = map[string]time.Time{}
	}
	if time.Since(a.lastWarn[key]) < 10*time.Second {
		return
	}
	a.lastWarn[key] = time.Now()
	m.log.Warn(msg, fields...)
}

// peerFailed logs, with the peer's ID, a member that refused this one's
// API call for a reason no retry fixes: its token or TLS settings differ.
func (a *apiAuth) peerFailed(m *Member, id string, err error) {
	if a == nil || (!errors.Is(err, api.ErrUnauthorized) && !strings.Contains(err.Error(), "certificate")) {
		return
	}
	a.warnEvery(m, "peer "+id, "a member refused this member's API call: the api settings (token_file, tls.ca_file, the API certificate's hosts) must suit every member",
		zap.String("member", id), zap.Error(err))
}

// require wraps h: every route except the open ones needs the bearer
// token. A missing or wrong token is answered 401 with what to do, and the
// request does nothing.
func (a *apiAuth) require(m *Member, h http.Handler) http.Handler {
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
			a.warnEvery(m, "token file", "this member cannot read api.token_file: it refuses every API request until the file is fixed", zap.Error(err))
			writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{Code: "not_leader", Error: "this member cannot read its api.token_file (fix the file on the member); ask another member"})
			return
		}
		scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		got = strings.TrimSpace(got)
		valid := slices.ContainsFunc(want, func(t string) bool { return subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 })
		if !valid {
			a.unauthorized.Add(1)
			a.warnEvery(m, "unauthorized", "API request refused: no or a wrong bearer token (counted in kmirror_api_unauthorized_total)",
				zap.String("remote", r.RemoteAddr), zap.String("method", r.Method), zap.String("path", r.URL.Path))
		}
		switch {
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

// clientFor returns a client of the API at addr (host:port) as this member
// calls it.
func (a *apiAuth) clientFor(addr string, timeout time.Duration) (*api.Client, error) {
	c, err := api.NewClient(a.scheme()+addr, timeout)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return c, nil
	}
	return c.WithAuth(a.clientTLS, a.currentToken()), nil
}

// httpClient is an http.Client for raw member-to-member calls.
func (a *apiAuth) httpClient(timeout time.Duration) *http.Client {
	c := &http.Client{Timeout: timeout}
	if a != nil && a.clientTLS != nil {
		c.Transport = &http.Transport{TLSClientConfig: a.clientTLS.Clone()}
	}
	return c
}

// certHoldsHost checks that a certificate is valid for host ("" skips the
// check), as a client dialing host verifies it.
func certHoldsHost(c tls.Certificate, host string) error {
	if host == "" {
		return nil
	}
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return err
		}
	}
	return leaf.VerifyHostname(host)
}
