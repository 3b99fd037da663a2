package httpapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/integration/harness"
)

// serveTLS serves the fake API over TLS as the member does (NewServer on
// Limit on a TLS listener) and counts the TCP connections accepted.
func serveTLS(t *testing.T, perClient int, idle time.Duration) (auth *Auth, addr string, limiter *ConnLimiter, accepted *atomic.Int64) {
	t.Helper()
	dir := t.TempDir()
	ca, err := harness.NewCA("api-ca")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(harness.CertOptions{CommonName: "member", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	auth, err = NewAuth(config.APIConfig{TLS: config.APITLSConfig{
		CertFile: writeTemp(t, dir, "api.pem", string(iss.CertPEM)),
		KeyFile:  writeTemp(t, dir, "api-key.pem", string(iss.KeyPEM)),
		CAFile:   writeTemp(t, dir, "ca.pem", string(ca.PEM)),
	}}, "m1", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewServer(NewHandler(&fakeAPI{mirrors: testMirrors}, zaptest.NewLogger(t), nil), zaptest.NewLogger(t))
	if idle > 0 {
		hs.IdleTimeout = idle
	}
	accepted = &atomic.Int64{}
	hs.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	limiter = Limit(ln, perClient, zaptest.NewLogger(t))
	go hs.Serve(tls.NewListener(limiter, auth.ServerTLS()))
	t.Cleanup(func() { hs.Close() })
	return auth, ln.Addr().String(), limiter, accepted
}

// TestMemberCallsShareConnections: 1,000 member-to-member calls over TLS,
// each through a new client as forwarding makes them (Auth.ClientFor,
// Auth.HTTPClient), reuse a few pooled connections instead of leaking one
// per call (issue 18: 1.98 fds/s on a leader).
func TestMemberCallsShareConnections(t *testing.T) {
	auth, addr, limiter, accepted := serveTLS(t, MaxConnsPerClient, 0)
	ctx := context.Background()
	for i := range 1000 {
		if i%2 == 0 {
			c, err := auth.ClientFor(addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.ListMirrors(ctx); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			continue
		}
		resp, err := auth.HTTPClient(5 * time.Second).Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if n := accepted.Load(); n > 4 {
		t.Fatalf("1,000 calls opened %d connections, want a few reused ones (%d open now)", n, limiter.Open())
	}
}

// TestIdleConnectionFlood: a client that opens connection after connection,
// makes one request on each and goes silent holds at most the per-client
// bound; the others are closed at accept, another client is still served,
// and idle connections are closed after the server's idle timeout.
func TestIdleConnectionFlood(t *testing.T) {
	const perClient = 50
	auth, addr, limiter, _ := serveTLS(t, perClient, 3*time.Second)
	srvTLS := auth.clientTLS.Clone()
	srvTLS.ServerName = "127.0.0.1"
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	// The flood comes from 127.0.0.2 (all of 127/8 is loopback on Linux),
	// so 127.0.0.1 stays another client.
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	served := 0
	for range 1000 {
		raw, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, raw)
		if open := limiter.Open(); open > perClient {
			t.Fatalf("%d connections open under the flood, want at most %d", open, perClient)
		}
		c := tls.Client(raw, srvTLS)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
			continue // closed at accept
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			continue // closed at accept
		}
		resp.Body.Close()
		served++
	}
	// Connections idle for the idle timeout (3s) during a slow flood free
	// their slots: allow one more round of them.
	if served > 2*perClient || served == 0 {
		t.Fatalf("the flooding client was served on %d connections, want at most about the bound %d (and some)", served, perClient)
	}
	if limiter.Refused() < 1000-2*perClient {
		t.Fatalf("refused %d connections, want at least %d", limiter.Refused(), 1000-2*perClient)
	}
	resp, err := auth.HTTPClient(5 * time.Second).Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("another client is not served under the flood: %v", err)
	}
	resp.Body.Close()
	for end := time.Now().Add(10 * time.Second); limiter.Open() > 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d connections still open 10s after going idle (idle timeout 3s)", limiter.Open())
		}
	}
	srv := NewServer(nil, zaptest.NewLogger(t))
	if srv.IdleTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 {
		t.Fatalf("server timeouts idle %s, header %s, read %s: all must be set", srv.IdleTimeout, srv.ReadHeaderTimeout, srv.ReadTimeout)
	}
}

// TestIdentifyMembers: over TLS a member's calls carry its name and its API
// certificate, which the server verifies against api.tls.ca_file; a client
// without one, or with one from another CA, is named but not proven.
func TestIdentifyMembers(t *testing.T) {
	auth, _, _, _ := serveTLS(t, MaxConnsPerClient, 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan api.Caller, 1)
	hs := NewServer(auth.Require(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- api.CallerOf(r.Context())
		w.Write([]byte("[]"))
	})), zaptest.NewLogger(t))
	go hs.Serve(tls.NewListener(ln, auth.ServerTLS()))
	t.Cleanup(func() { hs.Close() })
	addr := ln.Addr().String()
	ctx := context.Background()
	c, err := auth.ClientFor(addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.ListMirrors(ctx) //nolint:errcheck // the handler's answer is not a mirror list; the caller is what is checked
	if caller := <-got; caller.Member != "m1" || caller.Cert == nil || !caller.TLS {
		t.Fatalf("a member's call: %+v, want named m1 with its verified certificate", caller)
	}
	other, err := harness.NewCA("other-ca")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Issue(harness.CertOptions{CommonName: "m1", IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(stranger.CertPEM, stranger.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "another CA's certificate": {cert}} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: auth.clientTLS.RootCAs, Certificates: certs}}
		cl, _ := api.NewClient("https://"+addr, 5*time.Second)
		cl.WithTransport(tr, "").AsMember("m1").ListMirrors(ctx) //nolint:errcheck // as above
		if caller := <-got; caller.Member != "m1" || caller.Cert != nil {
			t.Fatalf("%s: %+v, want named m1 without a verified certificate", name, caller)
		}
	}
}
