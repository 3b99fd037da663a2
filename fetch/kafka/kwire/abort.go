package kwire

import (
	"fmt"
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

// RTT is the kernel's smoothed round-trip time of the connection (TCP_INFO;
// from the handshake on): 0 on a connection that is not TCP or when the
// kernel does not say.
func (c *Conn) RTT() time.Duration {
	if c.tcp == nil {
		return 0
	}
	rc, err := c.tcp.SyscallConn()
	if err != nil {
		return 0
	}
	var info *unix.TCPInfo
	if err := rc.Control(func(fd uintptr) {
		info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil || info == nil {
		return 0
	}
	return time.Duration(info.Rtt) * time.Microsecond
}
