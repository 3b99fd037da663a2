package harness

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// node is one Kafka JVM: a combined broker+controller, a broker or the
// controller. Its ports, folder and config stay the same across restarts.
type node struct {
	id    int
	roles string
	label string // "<cluster> broker-<i>" or "<cluster> controller"
	// host is the PLAINTEXT listener's address: 127.0.0.1, or the delay
	// line's far end.
	host string
	port int // PLAINTEXT listener, 0 on the controller-only node
	// advPort is the port clients are told: port, or its proxy's.
	advPort int
	proxy   *Proxy // nil unless Options.Proxy
	cport   int    // CONTROLLER listener, 0 on broker-only nodes
	// listeners are the ports of Options.Listeners by name.
	listeners map[string]int
	// listenerProxy (at listenerProxyPort) fronts the PROXIED listener.
	listenerProxy     *Proxy
	listenerProxyPort int
	dir               string
	out               *tailWriter
	proc              *process // nil while stopped; guarded by Cluster.mu
}

func (n *node) addr() string {
	return net.JoinHostPort(n.host, strconv.Itoa(n.advPort))
}

func (n *node) config() string {
	return filepath.Join(n.dir, "server.properties")
}

// process is one run of a node's JVM.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the JVM has exited and been reaped
	err  error         // exit status; read only after done
}

// signal sends SIGTERM to the JVM itself, or SIGKILL to its whole group.
func (p *process) signal(kill bool) {
	select {
	case <-p.done:
		return // reaped: the pid may belong to someone else by now
	default:
	}
	if kill {
		killGroup(p.cmd.Process.Pid)
	} else {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// kill kills the JVM's process group and waits until it is reaped.
func (p *process) kill() {
	p.signal(true)
	<-p.done
}

// launch starts n's JVM; it fails if n is running or the cluster closed.
func (c *Cluster) launch(n *node) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("harness: cluster %s is closed", c.name)
	}
	if n.proc != nil {
		select {
		case <-n.proc.done: // it died on its own: start it again
		default:
			return fmt.Errorf("harness: %s is already running", n.label)
		}
	}
	argv := append(jvmArgs(c.home, c.classpath, c.throughput, "-Xms256m", "-Xmx512m"), kafkaMain, n.config())
	if n.roles == zkRole {
		argv = append(jvmArgs(c.home, nil, c.throughput, "-Xms64m", "-Xmx256m"), zooKeeperMain, n.zooKeeperConfig())
	}
	cmd := exec.Command(c.java, argv...)
	if c.delayLine != nil {
		cmd = c.delayLine.Command(c.java, argv...)
	}
	cmd.Dir = n.dir
	cmd.Stdout = n.out
	cmd.Stderr = n.out
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = killWaitDelay
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("harness: starting %s: %w", n.label, err)
	}
	c.note("%s: started pid %d (node.id %d, %s)", n.label, cmd.Process.Pid, n.id, n.roles)
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		n.out.flush()
		close(p.done)
	}()
	n.proc = p
	return nil
}

// takeProc detaches n's running process, so that exactly one caller stops it.
func (c *Cluster) takeProc(n *node) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := n.proc
	n.proc = nil
	return p
}

// running returns n's process, or nil.
func (c *Cluster) running(n *node) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return n.proc
}

// lockedWriter serialises writes from several nodes into one Log.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

const tailLines = 40

// tailWriter forwards a node's output line by line, prefixed, to the
// cluster log and keeps the last lines for error messages.
type tailWriter struct {
	sink   io.Writer
	prefix string

	mu      sync.Mutex
	partial []byte
	tail    []string // ring of the last tailLines lines
	next    int
}

func newTailWriter(sink io.Writer, prefix string) *tailWriter {
	return &tailWriter{sink: sink, prefix: prefix}
}

func (t *tailWriter) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.partial = append(t.partial, b...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		t.line(string(t.partial[:i]))
		t.partial = t.partial[i+1:]
	}
	return len(b), nil
}

// flush emits an unterminated last line, e.g. from a JVM that crashed.
func (t *tailWriter) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.partial) > 0 {
		t.line(string(t.partial))
		t.partial = nil
	}
}

func (t *tailWriter) line(s string) {
	// A failing Log must not block or kill the JVM: its errors are dropped.
	_, _ = io.WriteString(t.sink, t.prefix+s+"\n")
	if len(t.tail) < tailLines {
		t.tail = append(t.tail, s)
		return
	}
	t.tail[t.next] = s
	t.next = (t.next + 1) % tailLines
}

// lines returns the kept lines, oldest first.
func (t *tailWriter) lines() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ordered := append(append([]string{}, t.tail[t.next:]...), t.tail[:t.next]...)
	return strings.Join(ordered, "\n")
}
