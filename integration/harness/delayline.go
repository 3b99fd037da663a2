package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// DelayLine is a network namespace that this one reaches over a
// point-to-point link delaying every packet by half a round trip in each
// direction: a cross-region link with real kernel TCP at both ends (this
// machine's kernel has no netem qdisc). The link is two TUN devices, one
// on each side, and a user-space relay between them; the MTU is 65000 so
// the relay moves few, large packets. Processes run in the namespace with
// Command; Kafka brokers with Options.DelayLine. Needs root (CAP_NET_ADMIN)
// and the ip command (iproute2).
type DelayLine struct {
	// Netns names the namespace (ip netns).
	Netns string
	// Local is this side's address, Remote the namespace's (IPv4).
	Local, Remote string

	half  atomic.Int64 // one-way delay, nanoseconds
	tuns  [2]*os.File  // this side's device, the namespace's
	names [2]string
	wg    sync.WaitGroup
	once  sync.Once
}

var delayLines atomic.Int32

// NewDelayLine creates the namespace and the link with round trip rtt
// (each packet held rtt/2 each way).
func NewDelayLine(rtt time.Duration) (*DelayLine, error) {
	n := delayLines.Add(1)
	if n > 250 {
		return nil, errors.New("harness: too many delay lines in one process")
	}
	id := fmt.Sprintf("%d%d", os.Getpid()%100000, n)
	d := &DelayLine{
		Netns: "kmwan" + id,
		Local: fmt.Sprintf("10.201.%d.1", n), Remote: fmt.Sprintf("10.201.%d.2", n),
		names: [2]string{"kmw" + id + "a", "kmw" + id + "b"},
	}
	d.SetRTT(rtt)
	fail := func(err error) (*DelayLine, error) {
		d.Close()
		return nil, fmt.Errorf("harness: delay line: %w", err)
	}
	for i, name := range d.names {
		f, err := openTUN(name)
		if err != nil {
			return fail(err)
		}
		d.tuns[i] = f
	}
	steps := [][]string{
		{"ip", "netns", "add", d.Netns},
		{"ip", "link", "set", d.names[1], "netns", d.Netns},
		{"ip", "addr", "add", d.Local, "peer", d.Remote, "dev", d.names[0]},
		{"ip", "link", "set", d.names[0], "mtu", "65000", "up"},
		{"ip", "netns", "exec", d.Netns, "ip", "addr", "add", d.Remote, "peer", d.Local, "dev", d.names[1]},
		{"ip", "netns", "exec", d.Netns, "ip", "link", "set", d.names[1], "mtu", "65000", "up"},
		{"ip", "netns", "exec", d.Netns, "ip", "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			return fail(fmt.Errorf("%s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out))))
		}
	}
	d.wg.Add(2)
	go d.relay(d.tuns[0], d.tuns[1])
	go d.relay(d.tuns[1], d.tuns[0])
	return d, nil
}

// openTUN creates a TUN device (IP packets, no packet information
// header); it lives as long as the file is open.
func openTUN(name string) (*os.File, error) {
	// Attached first, then handed to Go's poller: an unattached TUN file
	// cannot be polled, and os.OpenFile would leave it unpollable.
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun (needs root): %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// SetRTT changes the round trip for packets read from now on.
func (d *DelayLine) SetRTT(rtt time.Duration) { d.half.Store(int64(rtt / 2)) }

// relay moves packets from one device to the other, each leaving its
// one-way delay after it came in, in order.
func (d *DelayLine) relay(from, to *os.File) {
	defer d.wg.Done()
	type packet struct {
		b   []byte
		due time.Time
	}
	q := make(chan packet, 1<<16)
	go func() {
		defer close(q)
		buf := make([]byte, 1<<16)
		for {
			n, err := from.Read(buf)
			if err != nil {
				return // closed
			}
			q <- packet{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(d.half.Load()))}
		}
	}()
	for p := range q {
		if wait := time.Until(p.due); wait > 0 {
			time.Sleep(wait)
		}
		if _, err := to.Write(p.b); err != nil && errors.Is(err, os.ErrClosed) {
			for range q { // drain until the reader sees its device closed
			}
			return
		}
	}
}

// Command returns cmd name args run in the namespace (ip netns exec, which
// execs it: the process's pid is the command's).
func (d *DelayLine) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", d.Netns, name}, args...)...)
}

// DialContext dials addr from inside the namespace (a client in the far
// region, beside the brokers there: its connections do not cross the
// line). The socket is made by a thread that enters the namespace, and
// the thread goes back to this one before it serves other goroutines; the
// connection stays in the namespace whichever thread uses it later.
func (d *DelayLine) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := d.inNamespace(func() (err error) {
		var dialer net.Dialer
		c, err = dialer.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens on addr inside the namespace (a server in the far
// region).
func (d *DelayLine) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := d.inNamespace(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// inNamespace runs f on a thread inside the namespace. The thread comes
// back to its own namespace afterwards and only then serves other
// goroutines; one that cannot is left locked, so Go ends it with this
// goroutine. A thread must not end otherwise: a process the harness
// started from it (a broker, whose parent-death signal is tied to the
// starting thread, not the process) would be killed with it.
func (d *DelayLine) inNamespace(f func() error) error {
	type result struct{ err error }
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{fmt.Errorf("harness: this thread's network namespace: %w", err)}
			return
		}
		defer own.Close()
		target, err := os.Open("/var/run/netns/" + d.Netns)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{fmt.Errorf("harness: enter namespace %s: %w", d.Netns, err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{fmt.Errorf("harness: enter namespace %s: %w", d.Netns, err)}
			return
		}
		ferr := f()
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err != nil {
			// Left locked: the thread ends with this goroutine, never
			// serving another one in the wrong namespace.
			ch <- result{errors.Join(ferr, fmt.Errorf("harness: leave namespace %s: %w", d.Netns, err))}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ferr}
	}()
	return (<-ch).err
}

// Close removes the link and the namespace. Processes still running in it
// keep it alive until they exit (stop them first).
func (d *DelayLine) Close() error {
	var err error
	d.once.Do(func() {
		for _, f := range d.tuns {
			if f != nil {
				f.Close()
			}
		}
		d.wg.Wait()
		if out, e := exec.Command("ip", "netns", "del", d.Netns).CombinedOutput(); e != nil && !strings.Contains(string(out), "No such file") {
			err = fmt.Errorf("harness: ip netns del %s: %v: %s", d.Netns, e, strings.TrimSpace(string(out)))
		}
	})
	return err
}
