package kwire

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestAbortDiscardsUnsentBytes: bytes a request left in the send buffer
// (the receiver reads nothing) are discarded by Abort, and the receiver
// sees a reset; an ordinary Close would deliver every byte after the
// close (issue 19: a produce request arrived seconds after the lease).
func TestAbortDiscardsUnsentBytes(t *testing.T) {
	for _, abort := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				c.(*net.TCPConn).SetReadBuffer(4 << 10)
			}
			accepted <- c
		}()
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		tcp := raw.(*net.TCPConn)
		tcp.SetWriteBuffer(32 << 10)
		c := &Conn{addr: ln.Addr().String(), nc: raw, tcp: tcp}
		srv := <-accepted
		// Write until the kernel's buffers are full.
		written := 0
		buf := make([]byte, 16<<10)
		for {
			raw.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := raw.Write(buf)
			written += n
			if err != nil {
				break
			}
		}
		if abort {
			c.Abort()
		} else {
			c.Close()
		}
		srv.SetReadDeadline(time.Now().Add(10 * time.Second))
		read, err := io.Copy(io.Discard, srv)
		srv.Close()
		ln.Close()
		switch {
		case !abort && (err != nil || read != int64(written)):
			t.Fatalf("Close: the receiver read %d of %d bytes (%v): the test's premise (a close delivers the send buffer) does not hold", read, written, err)
		case abort && (read >= int64(written) || !errors.Is(err, syscall.ECONNRESET)):
			t.Fatalf("Abort: the receiver read %d of %d bytes, ending with %v; want fewer and a reset", read, written, err)
		}
		t.Logf("abort=%t: %d of %d bytes delivered (%v)", abort, read, written, err)
	}
}

// TestSetUserTimeout: TCP_USER_TIMEOUT is set on the socket (the kernel
// reads it back), so a produce connection gives up unacknowledged bytes.
func TestSetUserTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := &Conn{addr: ln.Addr().String(), nc: raw, tcp: raw.(*net.TCPConn)}
	if err := c.SetUserTimeout(3 * time.Second); err != nil {
		t.Fatal(err)
	}
	got, gerr := c.UserTimeout()
	if gerr != nil || got != 3*time.Second {
		t.Fatalf("TCP_USER_TIMEOUT reads back %v (%v), want 3s", got, gerr)
	}
}
