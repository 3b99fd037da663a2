package kwire

import (
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRoundTripIgnoresDelayedACKs: a request the other side holds (a
// fetch long poll) is acknowledged by its delayed ACK, and the kernel's
// smoothed round trip counts the delay; TCPRoundTrip, which sizes fetch
// connections (issue 20), must not, or an idle mirror on a LAN would open
// more connections to every source broker.
func TestRoundTripIgnoresDelayedACKs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b := make([]byte, 1)
		for {
			if _, err := io.ReadFull(c, b); err != nil {
				return
			}
			if b[0] == 1 {
				time.Sleep(100 * time.Millisecond) // a long poll: the ACK goes first, delayed
			}
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	c := nc.(*net.TCPConn)
	// Answers at once (the other side's kernel then takes the exchange
	// for interactive and delays its ACKs), then a held request.
	for i := range 60 {
		b := []byte{0}
		if i%6 == 5 {
			b[0] = 1
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	var infoErr error
	if err := rc.Control(func(fd uintptr) { info, infoErr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		t.Fatal(err)
	}
	if infoErr != nil {
		t.Fatalf("TCP_INFO: %v", infoErr)
	}
	got := TCPRoundTrip(c, false)
	smoothed := time.Duration(info.Rtt) * time.Microsecond
	t.Logf("after 10 held requests among 50 answered at once on loopback: smoothed round trip %v, TCPRoundTrip %v", smoothed, got)
	if smoothed <= 2*time.Millisecond {
		t.Skipf("this kernel did not delay its ACKs (smoothed round trip %v): nothing to ignore, the test proves nothing here", smoothed)
	}
	if got > 2*time.Millisecond {
		t.Fatalf("TCPRoundTrip on loopback after held requests: %v, want under 2ms (the delayed ACKs counted)", got)
	}
}
