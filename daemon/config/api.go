package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
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
	// Insecure accepts an API reachable beyond this host without a token,
	// or with a token but without TLS (refused otherwise, issue 18).
	Insecure bool `yaml:"insecure"`
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

// Check validates the api section alone (as Config.Validate does); host
// is the host other members reach this member's API by ("" when not
// known). The error lists every problem, one "field: problem" each.
func (a APIConfig) Check(host string) error {
	var errs problems
	a.validate(&errs, host)
	return errs.err()
}

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
		if _, err := ReadTokens(a.TokenFile); err != nil {
			errs.add("api.token_file", "%v", err)
		}
	}
	t := a.TLS
	if (t.CertFile == "") != (t.KeyFile == "") {
		errs.add("api.tls", "set both cert_file and key_file (PEM), or neither")
	} else if t.CertFile != "" {
		if c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			errs.add("api.tls", "cert_file %s and key_file %s: %v", t.CertFile, t.KeyFile, err)
		} else if err := CertHoldsHost(c, host); err != nil {
			errs.add("api.tls.cert_file", "%v: other members and the CLI reach this member's API at %s", err, host)
		}
	}
	if t.CertFile != "" && t.CAFile == "" {
		errs.add("api.tls.ca_file", "required with cert_file: members prove who they are to each other with API certificates "+
			"signed by this CA (with the system's CAs, any certificate a public CA issued for a member's host would speak for "+
			"that member); set it to the CA that signs the members' API certificates")
	}
	if t.CAFile != "" && t.CertFile == "" {
		errs.add("api.tls", "ca_file is set but cert_file and key_file are not, so the API would be plain HTTP: set them too, or remove ca_file")
	}
	if t.CAFile != "" {
		if _, err := CertPool(t.CAFile); err != nil {
			errs.add("api.tls.ca_file", "%v", err)
		}
	}
}

// validateExposure refuses an admin API reachable beyond this host (listen
// is http_listen) that anyone could call (no api.token_file), or whose
// token would cross the network in clear (no api.tls), unless api.insecure
// is set.
func (a APIConfig) validateExposure(errs *problems, listen string) {
	if a.Insecure || IsLoopbackListen(listen) {
		return
	}
	switch {
	case a.TokenFile == "":
		errs.add("http_listen", "%s is reachable beyond this host and api.token_file is not set: anyone who reaches it could delete mirrors, "+
			"drain members and change the group. Set api.token_file and api.tls (README, Security), listen on 127.0.0.1, "+
			"or set api.insecure: true to accept an open API", listen)
	case a.TLS.CertFile == "":
		errs.add("api.tls", "http_listen %s is reachable beyond this host, so the bearer token (api.token_file) and mirror properties would cross "+
			"the network in clear: set api.tls.cert_file and api.tls.key_file, or api.insecure: true to accept that", listen)
	}
}

// IsLoopbackListen reports whether a listen address (host:port) is on a
// loopback interface only: localhost or a loopback IP, not "" or 0.0.0.0.
func IsLoopbackListen(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// minTokenLength is the shortest bearer token accepted (16 characters, as
// 8 random bytes in hex).
const minTokenLength = 16

// ReadTokens reads a token file: one token per line, the first sent to
// other members, every one accepted (two during a rotation). Errors name
// the file, never its content.
func ReadTokens(path string) ([]string, error) {
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

// CertPool reads PEM CA certificates.
func CertPool(path string) (*x509.CertPool, error) {
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

// CertHoldsHost checks that a certificate is valid for host ("" skips the
// check), as a client dialing host verifies it.
func CertHoldsHost(c tls.Certificate, host string) error {
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
