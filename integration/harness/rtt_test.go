package harness_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestRoundTripFollowsALongerPathWithinOneBulkAnswer: kmirror sizes its
// fetch connections from kwire.TCPRoundTrip (issue 20). When the path's
// round trip grows under an open connection, the figures of what the
// receiving side sends (one request per answer) stay at the old round
// trip, while the receive side's estimate, read after bulk data, follows
// within a few answers (the kernel smooths it, 1/8 of each sample, and
// takes a sample per round of ACKs: after one 16 MiB answer CI read 7 ms
// of 50). A fresh connection knows the round trip from its handshake.
func TestRoundTripFollowsALongerPathWithinFewBulkAnswers(t *testing.T) {
	const rtt = 50 * time.Millisecond
	d := newDelayLine(t, 0)
	ln := mustListen(t, d, net.JoinHostPort(d.Remote, "0"))
	defer ln.Close()
	const answer = 16 << 20
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // a byte asks for an answer of 16 MiB
				defer c.Close()
				buf := make([]byte, 1<<20)
				req := make([]byte, 1)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					for sent := 0; sent < answer; sent += len(buf) {
						if _, err := c.Write(buf); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	dial := func() *net.TCPConn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.TCPConn)
	}
	ask := func(c *net.TCPConn) {
		if _, err := c.Write([]byte{1}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.CopyN(io.Discard, c, answer); err != nil {
			t.Fatal(err)
		}
	}
	c := dial()
	ask(c)
	ask(c)
	if got := kwire.TCPRoundTrip(c, true); got >= rtt/2 {
		t.Fatalf("round trip at 0 ms: %v", got)
	}
	d.SetRTT(rtt)
	const maxAnswers = 8
	var sent, bulk time.Duration
	answers := 0
	for answers < maxAnswers && bulk < rtt/2 {
		ask(c)
		answers++
		sent, bulk = kwire.TCPRoundTrip(c, false), kwire.TCPRoundTrip(c, true)
		t.Logf("after %d answer(s) across %v: send side %v, with the receive side %v", answers, rtt, sent, bulk)
	}
	if sent >= rtt/2 {
		t.Fatalf("the send side's round trip followed the longer path (%v): this test no longer shows why the receive side is read", sent)
	}
	if bulk < rtt/2 || bulk > 2*rtt {
		t.Fatalf("round trip read after %d bulk answers: %v, want about %v", answers, bulk, rtt)
	}
	if fresh := kwire.TCPRoundTrip(dial(), false); fresh < rtt*8/10 || fresh > 2*rtt {
		t.Fatalf("a fresh connection's round trip: %v, want about %v", fresh, rtt)
	}
}
