package kwire

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Abort closes the connection with a reset (SO_LINGER 0): the kernel
// discards whatever the connection's send buffer still holds instead of
// delivering it after the close, as an ordinary Close does. A produce
// request written before a member's lease ended must not reach the broker
// seconds later because TCP retransmits it after the close (issue 19:
// the write deadline bounds what enters the kernel, not delivery).
func (c *Conn) Abort() error {
	if c.tcp != nil {
		if err := c.tcp.SetLinger(0); err != nil {
			c.nc.Close()
			return fmt.Errorf("abort connection to %s: %w", c.addr, err)
		}
	}
	return c.nc.Close()
}

// SetUserTimeout sets TCP_USER_TIMEOUT (Linux, RFC 5482): the kernel
// aborts the connection, discarding its send buffer, once data it sent has
// gone unacknowledged for d (milliseconds precision), so a request stuck
// behind a lossy link is not retransmitted into the broker long after the
// sender gave up on it. It is a no-op on a connection that is not TCP.
func (c *Conn) SetUserTimeout(d time.Duration) error {
	if c.tcp == nil {
		return nil
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT on connection to %s: %w", c.addr, serr)
	}
	return nil
}

// UserTimeout reads TCP_USER_TIMEOUT back from the socket (0: the
// kernel's default; also 0 on a connection that is not TCP).
func (c *Conn) UserTimeout() (time.Duration, error) {
	if c.tcp == nil {
		return 0, nil
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return 0, err
	}
	var ms int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		ms, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
	}); err != nil {
		return 0, err
	}
	return time.Duration(ms) * time.Millisecond, gerr
}

// RTT is the connection's round-trip time as the kernel measures it
// (TCPRoundTrip): 0 on a connection that is not TCP or when the kernel
// does not say.
func (c *Conn) RTT(bulk bool) time.Duration {
	if c.tcp == nil {
		return 0
	}
	return TCPRoundTrip(c.tcp, bulk)
}

// TCPRoundTrip is a TCP connection's round-trip time as the kernel
// measures it (TCP_INFO): the least round trip of what this side sent
// (tcpi_min_rtt, over the kernel's window of 5 minutes, from the
// handshake on), or, with bulk set, the larger of that and the receive
// side's estimate (tcpi_rcv_rtt); 0 when the kernel does not say.
//
// Not the smoothed tcpi_rtt: a request the broker holds (a fetch long
// poll) is acknowledged only by the broker's delayed ACK, some 40 ms
// later, and tcpi_rtt counts that delay: on loopback it read 5 ms after a
// few long polls. And a side that mostly receives, as a fetch connection
// does, sends about one segment per request, so when the path's round
// trip grows under an open connection, the send side's figures take
// dozens of requests to follow (tcpi_min_rtt only drops). tcpi_rcv_rtt is
// sampled from every full-sized segment received (with TCP timestamps,
// Linux's default) and follows within a few large answers (the kernel
// smooths it, 1/8 of each sample); but a segment that follows a wait on
// the other side (a long poll answered with data)
// counts the wait too, so it is only worth reading just after bulk data
// came in (bulk).
func TCPRoundTrip(tc *net.TCPConn, bulk bool) time.Duration {
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var info *unix.TCPInfo
	if err := rc.Control(func(fd uintptr) {
		info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || info == nil {
		return 0
	}
	rtt := info.Min_rtt
	if rtt == 0 || rtt == noMinRTT {
		rtt = info.Rtt // kernels before 4.6 do not say; no sample yet
	}
	if bulk && info.Options&tcpiOptTimestamps != 0 {
		// Without timestamps the kernel's receive-side figure is the
		// time one window took to come in, not a round trip.
		rtt = max(rtt, info.Rcv_rtt)
	}
	return time.Duration(rtt) * time.Microsecond
}

const (
	// noMinRTT is tcpi_min_rtt before the first sample (the kernel's
	// minmax filter starts at ~0U).
	noMinRTT = ^uint32(0)
	// tcpiOptTimestamps is TCPI_OPT_TIMESTAMPS of linux/tcp.h: the
	// connection carries TCP timestamps (RFC 7323), from which the
	// kernel samples tcpi_rcv_rtt.
	tcpiOptTimestamps = 1
)
