package httpapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
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

// TestAPIToken: every route but the open ones needs the token; a missing
// or wrong token is a 401 saying what to do, and the request does nothing;
// a replaced token file takes effect.
func TestAPIToken(t *testing.T) {
	dir := t.TempDir()
	tokenFile := writeTemp(t, dir, "token", "first-token-0123456789\n")
	auth, err := NewAuth(config.APIConfig{TokenFile: tokenFile, OpenRoutes: []string{"/healthz", "/readyz"}}, "m1", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAPI{mirrors: testMirrors}
	srv := httptest.NewServer(auth.Require(NewHandler(f, zaptest.NewLogger(t), http.NotFoundHandler())))
	defer srv.Close()
	ctx := context.Background()
	client := func(token string) *api.Client {
		c, err := api.NewClient(srv.URL, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return c.WithAuth(nil, token)
	}
	for token, want := range map[string]string{"": "needs a bearer token: pass --token-file", "wrong": "the bearer token is not this kmirror group's"} {
		err := client(token).CreateMirror(ctx, api.CreateMirrorRequest{Name: "m9", Properties: map[string]string{"bootstrap.servers": "a:1"}})
		if !errors.Is(err, api.ErrUnauthorized) || !strings.Contains(err.Error(), want) {
			t.Fatalf("create with token %q: %v, want ErrUnauthorized saying %q", token, err, want)
		}
	}
	if f.lastCall() != "" {
		t.Fatalf("an unauthenticated request reached the API: %s", f.lastCall())
	}
	if _, err := client("first-token-0123456789").ListMirrors(ctx); err != nil {
		t.Fatalf("list with the token: %v", err)
	}
	// Open routes answer without a token; /metrics was not opened here.
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/metrics": 401} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s without a token: %d, want %d", path, resp.StatusCode, want)
		}
	}
	// Rotation: the file is replaced; the old token stops working.
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	writeTemp(t, dir, "token", "second-token-longer\n")
	if _, err := client("first-token-0123456789").ListMirrors(ctx); !errors.Is(err, api.ErrUnauthorized) {
		t.Fatalf("the replaced token still works: %v", err)
	}
	if _, err := client("second-token-longer").ListMirrors(ctx); err != nil {
		t.Fatalf("the new token: %v", err)
	}
	// A rotation without a window: both tokens accepted while the file
	// holds both; the scheme is case-insensitive (RFC 7235).
	writeTemp(t, dir, "token", "second-token-longer\nthird-token-0123456789\n")
	for _, tok := range []string{"second-token-longer", "third-token-0123456789"} {
		if _, err := client(tok).ListMirrors(ctx); err != nil {
			t.Fatalf("token %s while the file holds two: %v", tok, err)
		}
	}
	if auth.CurrentToken() != "second-token-longer" {
		t.Fatalf("members send %q, want the file's first line", auth.CurrentToken())
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/v1/mirrors", nil)
	req.Header.Set("Authorization", "bearer third-token-0123456789")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("lower-case scheme: %v %v", resp, err)
	}
	if got := auth.UnauthorizedTotal(); got < 3 {
		t.Fatalf("refused requests counted %d, want at least 3", got)
	}
}

// TestAPITLS serves the API over TLS: a client trusting the CA works, one
// that does not is told to pass --ca, and a plain-HTTP client is told to
// use https://.
func TestAPITLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := harness.NewCA("api-ca")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(harness.CertOptions{CommonName: "member", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.APIConfig{TLS: config.APITLSConfig{
		CertFile: writeTemp(t, dir, "api.pem", string(iss.CertPEM)),
		KeyFile:  writeTemp(t, dir, "api-key.pem", string(iss.KeyPEM)),
		CAFile:   writeTemp(t, dir, "ca.pem", string(ca.PEM)),
	}}
	if err := cfg.Check("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Check("kmirror-2.example"); err == nil || !strings.Contains(err.Error(), "api.tls.cert_file: x509: certificate is not valid for any names, but wanted to match kmirror-2.example: other members and the CLI reach this member") {
		t.Fatalf("a certificate without the member's API host: %v", err)
	}
	auth, err := NewAuth(cfg, "m1", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	// Served as the member serves it (listen in member.go).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: NewHandler(&fakeAPI{mirrors: testMirrors}, zaptest.NewLogger(t), nil)}
	go hs.Serve(tls.NewListener(ln, auth.ServerTLS()))
	defer hs.Close()
	addr := ln.Addr().String()
	srv := struct{ URL string }{"https://" + addr}
	ctx := context.Background()
	member, err := auth.ClientFor(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := member.ListMirrors(ctx); err != nil {
		t.Fatalf("a member calling another over TLS: %v", err)
	}
	plain, _ := api.NewClient(srv.URL, 5*time.Second)
	if _, err := plain.WithAuth(&tls.Config{RootCAs: x509.NewCertPool()}, "").ListMirrors(ctx); err == nil ||
		!strings.Contains(err.Error(), "pass --ca FILE (or KMIRROR_CA)") {
		t.Fatalf("client without the CA: %v", err)
	}
	http1, _ := api.NewClient("http://"+addr, 5*time.Second)
	if _, err := http1.ListMirrors(ctx); err == nil || !strings.Contains(err.Error(), "serves HTTPS (api.tls): use https://") {
		t.Fatalf("plain HTTP client: %v", err)
	}
}
