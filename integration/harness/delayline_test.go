package harness_test

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

// mustListen listens on addr inside d's namespace.
func mustListen(t *testing.T, d *harness.DelayLine, addr string) net.Listener {
	t.Helper()
	ln, err := d.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// newDelayLine makes a delay line for the test, or skips it where this
// machine cannot (not root, no iproute2, no TUN device, no permission for
// network namespaces).
func newDelayLine(t *testing.T, rtt time.Duration) *harness.DelayLine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, TUN devices)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs the ip command (iproute2)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("needs a TUN device: %v", err)
	}
	d, err := harness.NewDelayLine(rtt)
	if err != nil {
		if strings.Contains(err.Error(), "Operation not permitted") {
			t.Skipf("network namespaces not permitted here: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// TestDelayLine: a TCP connection into the namespace takes the round trip
// to open (SYN, SYN-ACK), and bulk data crosses it in order.
func TestDelayLine(t *testing.T) {
	const rtt = 40 * time.Millisecond
	d := newDelayLine(t, rtt)
	ln := mustListen(t, d, net.JoinHostPort(d.Remote, "0"))
	defer ln.Close()
	const size = 64 << 20
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		for i := range buf {
			buf[i] = byte(i)
		}
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if took := time.Since(start); took < rtt {
		t.Fatalf("connecting across a %v delay line took %v", rtt, took)
	}
	start = time.Now()
	buf := make([]byte, 1<<20)
	got := 0
	for got < size {
		n, err := c.Read(buf)
		for i := range n {
			if buf[i] != byte((got+i)%(1<<20)) {
				t.Fatalf("byte %d: %d, want %d", got+i, buf[i], byte((got+i)%(1<<20)))
			}
		}
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got != size {
		t.Fatalf("read %d of %d bytes", got, size)
	}
	t.Logf("%d MiB across a %v round trip in %v: %.0f MB/s on one connection", size>>20, rtt, time.Since(start).Round(time.Millisecond), float64(size)/1e6/time.Since(start).Seconds())

	// A client dialing from inside the namespace stays on its side of the
	// line: its connection's own address is the namespace's, not Local.
	inside, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if host, _, _ := net.SplitHostPort(inside.LocalAddr().String()); host != d.Remote {
		t.Fatalf("a connection dialed inside the namespace comes from %s, want %s (the namespace's side)", host, d.Remote)
	}
	if host, _, _ := net.SplitHostPort(c.LocalAddr().String()); host != d.Local {
		t.Fatalf("a connection dialed outside comes from %s, want %s", host, d.Local)
	}
}

// TestClusterAcrossDelayLine: a broker in a delay line's namespace serves
// clients here across the round trip.
func TestClusterAcrossDelayLine(t *testing.T) {
	skipShort(t)
	const rtt = 30 * time.Millisecond
	d := newDelayLine(t, rtt)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := harness.Start(ctx, harness.Options{Name: "far", DelayLine: d})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if addr := c.BrokerAddrs()[0]; !strings.HasPrefix(addr, d.Remote+":") {
		t.Fatalf("broker address %s, want one at the delay line's far end %s", addr, d.Remote)
	}
	if err := c.CreateTopic(ctx, "far", 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	offset := produce(ctx, t, c.BrokerAddrs(), "far", 0, "across the line")
	assertRecord(ctx, t, c.BrokerAddrs(), "far", 0, offset, "across the line")
	start := time.Now()
	conn, err := net.Dial("tcp", c.BrokerAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if took := time.Since(start); took < rtt {
		t.Fatalf("connecting to the broker took %v, less than the line's round trip %v", took, rtt)
	}
}
