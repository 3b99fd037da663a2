package daemon

import (
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

// TestStopWaitsOutUnusedConnections: a connection that never sent a
// request (a client's spare one) does not make a stop force-close the API
// or fail: net/http holds Shutdown for it until it is over 5 s old, and
// the stop waits longer (CI: a 5 s wait made a member exit 1 on SIGTERM).
// A request still running at the end of the wait is closed, and the stop
// goes on.
func TestStopWaitsOutUnusedConnections(t *testing.T) {
	serve := func(h http.Handler) (*http.Server, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h}
		go srv.Serve(ln)
		return srv, ln.Addr().String()
	}
	log := zaptest.NewLogger(t)

	srv, addr := serve(http.NotFoundHandler())
	spare, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer spare.Close()
	time.Sleep(100 * time.Millisecond) // accepted: StateNew on the server
	start := time.Now()
	if shutdownAPI(srv, apiStopWait, log) {
		t.Fatalf("an unused connection made the stop close the API after %v (net/http holds it for 5 s)", time.Since(start))
	}
	t.Logf("stop waited %v for an unused connection", time.Since(start).Round(time.Millisecond))

	hung := make(chan struct{})
	defer close(hung)
	srv, addr = serve(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hung }))
	go http.Get("http://" + addr + "/")
	time.Sleep(100 * time.Millisecond)
	if !shutdownAPI(srv, 200*time.Millisecond, log) {
		t.Fatal("a request still running at the end of the wait was not closed")
	}
}
