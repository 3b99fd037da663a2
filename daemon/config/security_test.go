package config

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kmirror/kmirror/integration/harness"
)

func writeTemp(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAPIConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		cfg  APIConfig
		want string
	}{
		{APIConfig{OpenRoutes: []string{"/v1/mirrors"}}, `api.open_routes[0]: "/v1/mirrors": only /healthz, /readyz, /metrics`},
		{APIConfig{TokenFile: filepath.Join(dir, "none")}, "api.token_file: open"},
		{APIConfig{TokenFile: writeTemp(t, dir, "empty", "\n")}, "must hold one token"},
		{APIConfig{TokenFile: writeTemp(t, dir, "short", "abc\n")}, "each of at least 16 characters"},
		{APIConfig{TLS: APITLSConfig{CertFile: "/x.pem"}}, "api.tls: set both cert_file and key_file"},
		{APIConfig{TLS: APITLSConfig{CAFile: writeTemp(t, dir, "ca.pem", "x")}}, "api.tls: ca_file is set but cert_file and key_file are not"},
		{APIConfig{TLS: APITLSConfig{CertFile: "/x.pem", KeyFile: "/x-key.pem"}}, "api.tls.ca_file: required with cert_file"},
	}
	for _, c := range cases {
		var errs problems
		c.cfg.validate(&errs, "")
		if err := errs.err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestRaftTLSCertificateHoldsHost: a member whose raft certificate lacks
// the host the others dial it by is an invalid config, not a member that
// waits forever.
func TestRaftTLSCertificateHoldsHost(t *testing.T) {
	dir := t.TempDir()
	ca, err := harness.NewCA("members")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(harness.CertOptions{CommonName: "m1", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	r := RaftTLSConfig{CertFile: writeTemp(t, dir, "m.pem", string(iss.CertPEM)), KeyFile: writeTemp(t, dir, "k.pem", string(iss.KeyPEM)),
		CAFile: writeTemp(t, dir, "ca.pem", string(ca.PEM))}
	var errs problems
	r.validate(&errs, "127.0.0.1:7080")
	if errs.err() != nil {
		t.Fatal(errs.err())
	}
	r.validate(&errs, "10.0.0.9:7080")
	if err := errs.err(); err == nil || !strings.Contains(err.Error(), "raft_tls.cert_file") || !strings.Contains(err.Error(), "raft_advertise") {
		t.Fatalf("a raft certificate without the advertised host: %v", err)
	}
}

// TestOpenAPIRefused: an API reachable beyond loopback needs a token and
// TLS unless api.insecure is set (issue 18: an open API by default).
func TestOpenAPIRefused(t *testing.T) {
	token := writeTemp(t, t.TempDir(), "token", "0123456789abcdef0123456789abcdef\n")
	for _, tc := range []struct {
		name, extra, want string
	}{
		{"loopback, no token", "http_listen: 127.0.0.1:8080\n", ""},
		{"localhost, no token", "http_listen: localhost:8080\n", ""},
		{"IPv6 loopback, no token", "http_listen: \"[::1]:8080\"\n", ""},
		{"every interface, no token", "http_listen: 0.0.0.0:8080\n", "http_listen: 0.0.0.0:8080 is reachable beyond this host and api.token_file is not set"},
		{"empty host, no token", "http_listen: \":8080\"\n", "http_listen: :8080 is reachable beyond this host"},
		{"an address, token without TLS", "http_listen: 10.0.0.1:8080\napi: {token_file: " + token + "}\n",
			"api.tls: http_listen 10.0.0.1:8080 is reachable beyond this host, so the bearer token (api.token_file) and mirror properties would cross the network in clear"},
		{"insecure, no token", "http_listen: 0.0.0.0:8080\napi: {insecure: true}\n", ""},
		{"insecure, token without TLS", "http_listen: 10.0.0.1:8080\napi: {insecure: true, token_file: " + token + "}\n", ""},
	} {
		_, err := parseConfig([]byte(minimalConfig + tc.extra))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
