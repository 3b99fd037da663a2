package httpapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
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
func serveTLS(t *testing.T, perClient, maxTotal int, idle time.Duration) (auth *Auth, addr string, limiter *ConnLimiter, accepted *atomic.Int64) {
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
	limiter = Limit(ln, perClient, maxTotal, zaptest.NewLogger(t))
	hs.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
		limiter.Track(c, s)
	}
	go hs.Serve(tls.NewListener(limiter, auth.ServerTLS()))
	t.Cleanup(func() { hs.Close() })
	return auth, ln.Addr().String(), limiter, accepted
}

// TestMemberCallsShareConnections: 1,000 member-to-member calls over TLS,
// each through a new client as forwarding makes them (Auth.ClientFor,
// Auth.HTTPClient), reuse a few pooled connections instead of leaking one
// per call (issue 18: 1.98 fds/s on a leader).
func TestMemberCallsShareConnections(t *testing.T) {
	auth, addr, limiter, accepted := serveTLS(t, MaxConnsPerClient, MaxConns, 0)
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
// bound: each new connection takes the place of its longest-idle one, so a
// probe from the same address is still served, as is another client, and
// so is a request from an address that keeps twice the bound of silent
// connections (slowloris); idle connections are closed after the server's
// idle timeout.
func TestIdleConnectionFlood(t *testing.T) {
	const perClient = 50
	auth, addr, limiter, _ := serveTLS(t, perClient, MaxConns, 3*time.Second)
	srvTLS := auth.clientTLS.Clone()
	srvTLS.ServerName = "127.0.0.1"
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	// request makes one request on a new connection from ip and keeps the
	// connection open; false when the connection was closed at accept.
	request := func(ip string) bool {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		raw, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, raw)
		c := tls.Client(raw, srvTLS)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
			return false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	// The flood comes from 127.0.0.2 (all of 127/8 is loopback on Linux),
	// so 127.0.0.1 stays another client.
	served := 0
	for range 1000 {
		if request("127.0.0.2") {
			served++
		}
		if open := limiter.Open(); open > perClient {
			t.Fatalf("%d connections open under the flood, want at most %d", open, perClient)
		}
	}
	// A connection is marked idle just after its response is written: the
	// next dial may come first and find none idle yet.
	if served < 500 || limiter.Evicted() < 500-perClient {
		t.Fatalf("the flooding client was served on %d of 1000 connections (%d idle ones closed for new ones), want most",
			served, limiter.Evicted())
	}
	// A probe from the flooding address while it holds the bound.
	time.Sleep(100 * time.Millisecond)
	if !request("127.0.0.2") {
		t.Fatal("a probe from the address holding the most idle connections allowed was not served")
	}
	resp, err := auth.HTTPClient(5 * time.Second).Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("another client is not served under the flood: %v", err)
	}
	resp.Body.Close()

	// Slowloris from the same address: 127.0.0.3 keeps more than the
	// bound of connections that never start their TLS handshake, opening
	// a new one 100 ms after one is closed; every one of them within its
	// grace (a minute here), so none counts as slow. Requests from that
	// address are served all along: each takes the place of the oldest
	// silent connection (before, such a request was refused at accept).
	limiter.grace.Store(int64(time.Minute))
	const silent = perClient + 10
	stop := make(chan struct{})
	var wg sync.WaitGroup
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}, Timeout: 5 * time.Second}
	for range silent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				raw, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				raw.SetReadDeadline(time.Now().Add(3 * time.Second))
				raw.Read(buf) // returns once closed (evicted or refused)
				raw.Close()
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	for i := range 20 {
		if !request("127.0.0.3") {
			t.Fatalf("request %d from the address of %d silent connections was not served (%d evicted, %d refused)",
				i, silent, limiter.Evicted(), limiter.Refused())
		}
		if open := limiter.Open(); open > 2*perClient+1 {
			t.Fatalf("%d connections open, want at most %d", open, 2*perClient+1)
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for _, c := range held {
		c.Close()
	}
	held = nil
	for end := time.Now().Add(15 * time.Second); limiter.Open() > 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d connections still open 15s after the clients closed or went idle (idle timeout 3s)", limiter.Open())
		}
	}
	srv := NewServer(nil, zaptest.NewLogger(t))
	if srv.IdleTimeout <= 0 || srv.ReadHeaderTimeout <= 0 || srv.ReadTimeout <= 0 {
		t.Fatalf("server timeouts idle %s, header %s, read %s: all must be set", srv.IdleTimeout, srv.ReadHeaderTimeout, srv.ReadTimeout)
	}
}

// TestGlobalConnectionBound: beyond MaxConns in all, a new connection
// takes the place of the longest-idle one of any client.
func TestGlobalConnectionBound(t *testing.T) {
	auth, addr, limiter, _ := serveTLS(t, MaxConnsPerClient, 20, 0)
	var clients []*http.Client
	for i := range 30 {
		tr := &http.Transport{TLSClientConfig: auth.clientTLS.Clone(), DialContext: (&net.Dialer{
			LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}).DialContext}
		tr.TLSClientConfig.ServerName = "127.0.0.1"
		c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		clients = append(clients, c)
		resp, err := c.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("client %d not served: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(5 * time.Millisecond) // the server marks it idle
		if open := limiter.Open(); open > 20 {
			t.Fatalf("%d connections open, want at most the bound 20", open)
		}
	}
	if limiter.Evicted() < 10 {
		t.Fatalf("%d idle connections closed for new ones, want at least 10", limiter.Evicted())
	}
	for _, c := range clients {
		c.CloseIdleConnections()
	}
}

// TestIdentifyMembers: over TLS a member's calls carry its name and its API
// certificate, which the server verifies against api.tls.ca_file; a client
// without one, or with one from another CA, is named but not proven.
func TestIdentifyMembers(t *testing.T) {
	auth, _, _, _ := serveTLS(t, MaxConnsPerClient, MaxConns, 0)
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

// TestVictimOrder: the connection that gives its place first is the
// longest idle or slow one; then the oldest new one within its grace; a
// connection serving a request never.
func TestVictimOrder(t *testing.T) {
	now := time.Now()
	idle := &limitedConn{idleSince: now.Add(-time.Second)}
	slow := &limitedConn{fresh: true, acceptedAt: now.Add(-3 * time.Second)}
	young := &limitedConn{fresh: true, acceptedAt: now.Add(-100 * time.Millisecond)}
	younger := &limitedConn{fresh: true, acceptedAt: now.Add(-10 * time.Millisecond)}
	busy := &limitedConn{acceptedAt: now.Add(-time.Hour)}
	set := func(cs ...*limitedConn) map[*limitedConn]struct{} {
		m := map[*limitedConn]struct{}{}
		for _, c := range cs {
			m[c] = struct{}{}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		cs   map[*limitedConn]struct{}
		want *limitedConn
	}{
		{"slow before idle (it waits longer)", set(idle, slow, young, busy), slow},
		{"idle before new within the grace", set(idle, young, younger, busy), idle},
		{"the oldest new one", set(young, younger, busy), young},
		{"never one serving a request", set(busy), nil},
	} {
		if got, _ := pickVictim(tc.cs, time.Second); got != tc.want {
			t.Errorf("%s: picked %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
