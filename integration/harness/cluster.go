package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	readyTimeout = 90 * time.Second
	stopTimeout  = 20 * time.Second
	// controllerID is the node.id of the controller-only node; brokers are
	// 1..N so that broker index i is node i+1.
	controllerID = 100
)

// Cluster is a running Kafka cluster. Its methods are safe for concurrent
// use.
type Cluster struct {
	name       string
	home       string // assembled Kafka: libs/, log4j2.properties
	java       string
	dir        string
	ownDir     bool
	clusterID  string
	throughput bool
	classpath  []string // Options.Classpath
	logFile    *os.File // the default Log, closed by Close
	sink       *lockedWriter

	formatArgs []string
	zk         bool       // ZooKeeper mode (Options.ZooKeeper): controller is the ZooKeeper node
	delayLine  *DelayLine // nil: the nodes run in this network namespace
	brokers    []*node    // index i is node.id i+1
	controller *node      // nil when the single broker is also the controller

	mu     sync.Mutex // guards node.proc and closed
	closed bool
}

// Start formats and starts a cluster and waits (up to 90 s) until every
// broker serves metadata listing all brokers. On error nothing is left
// running.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Name == "" {
		opts.Name = "kafka"
	}
	if opts.Brokers == 0 {
		opts.Brokers = 1
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, errors.New("harness: java not found: install a JDK 17, e.g. apt-get install -y openjdk-17-jre-headless")
	}
	home, err := kafkaHome(opts.KafkaVersion)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		name:       opts.Name,
		home:       home,
		java:       java,
		dir:        opts.Dir,
		throughput: opts.Throughput,
		classpath:  opts.Classpath,
		delayLine:  opts.DelayLine,
		zk:         opts.ZooKeeper,
	}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kmirror-"+opts.Name+"-"); err != nil {
			return nil, fmt.Errorf("harness: %w", err)
		}
		c.ownDir = true
	} else if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("harness: Options.Dir: %w", err)
	}
	// From here on Close undoes whatever was set up.
	fail := func(err error) (*Cluster, error) {
		_ = c.Close()
		return nil, err
	}
	log := opts.Log
	if log == nil {
		if c.logFile, err = os.Create(filepath.Join(c.dir, "kafka.log")); err != nil {
			return fail(fmt.Errorf("harness: %w", err))
		}
		log = c.logFile
	}
	c.sink = &lockedWriter{w: log}
	if !c.zk { // in ZooKeeper mode the first broker creates it
		if c.clusterID, err = newClusterID(); err != nil {
			return fail(err)
		}
	}
	if err := c.layout(opts); err != nil {
		return fail(err)
	}
	if err := c.format(ctx); err != nil {
		return fail(err)
	}
	for _, n := range c.brokers {
		if opts.Proxy {
			if n.proxy, err = newProxy(n.addr(), fmt.Sprintf("127.0.0.1:%d", n.port)); err != nil {
				return fail(err)
			}
		}
		if n.listenerProxyPort != 0 {
			listen, target := fmt.Sprintf("127.0.0.1:%d", n.listenerProxyPort), fmt.Sprintf("127.0.0.1:%d", n.listeners[proxiedListener])
			if n.listenerProxy, err = newProxy(listen, target); err != nil {
				return fail(err)
			}
		}
	}
	for _, n := range c.nodes() {
		if err := c.launch(n); err != nil {
			return fail(err)
		}
	}
	if err := c.waitReady(ctx); err != nil {
		return fail(err)
	}
	return c, nil
}

// layout picks ports, folders and server.properties for every node.
func (c *Cluster) layout(opts Options) error {
	nproxy := 0
	if opts.Proxy {
		nproxy = opts.Brokers
	}
	nlproxy := 0
	if slices.Contains(opts.Listeners, proxiedListener) {
		nlproxy = opts.Brokers
	}
	ports, err := freePorts(opts.Brokers + 1 + nproxy + opts.Brokers*len(opts.Listeners) + nlproxy)
	if err != nil {
		return err
	}
	listenerProxyPorts := ports[opts.Brokers+1+nproxy+opts.Brokers*len(opts.Listeners):]
	listenerPorts := ports[opts.Brokers+1+nproxy : opts.Brokers+1+nproxy+opts.Brokers*len(opts.Listeners)]
	ports = ports[:opts.Brokers+1+nproxy]
	proxyPorts := ports[opts.Brokers+1:]
	c.formatArgs = opts.FormatArgs
	protocolMap := "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
	if c.zk {
		protocolMap = "PLAINTEXT:PLAINTEXT"
	}
	for _, l := range opts.Listeners {
		protocol := l
		if l == proxiedListener {
			protocol = "PLAINTEXT"
		}
		protocolMap += "," + l + ":" + protocol
	}
	rf := strconv.Itoa(min(3, opts.Brokers))
	common := map[string]string{
		"listener.security.protocol.map":                   protocolMap,
		"controller.listener.names":                        "CONTROLLER",
		"auto.create.topics.enable":                        "false",
		"group.initial.rebalance.delay.ms":                 "0",
		"offsets.topic.num.partitions":                     "5",
		"offsets.topic.replication.factor":                 rf,
		"transaction.state.log.num.partitions":             "5",
		"transaction.state.log.replication.factor":         rf,
		"transaction.state.log.min.isr":                    "1",
		"share.coordinator.state.topic.replication.factor": rf,
		"share.coordinator.state.topic.min.isr":            "1",
		"log.cleaner.dedupe.buffer.size":                   "2097152",
		"log.segment.delete.delay.ms":                      "1000",
		"num.network.threads":                              "2",
		"num.io.threads":                                   "2",
		"background.threads":                               "2",
	}
	if c.zk {
		for _, k := range []string{"controller.listener.names", "share.coordinator.state.topic.replication.factor", "share.coordinator.state.topic.min.isr"} {
			delete(common, k)
		}
	}
	newNode := func(id int, roles string, port, cport int) (*node, error) {
		n := &node{id: id, roles: roles, host: "127.0.0.1", port: port, cport: cport, advPort: port}
		if c.delayLine != nil {
			n.host = c.delayLine.Remote
		}
		if port != 0 {
			n.label = fmt.Sprintf("%s broker-%d", c.name, id-1)
		} else {
			n.label = c.name + " controller"
		}
		n.dir = filepath.Join(c.dir, fmt.Sprintf("node-%d", id))
		if _, err := os.Stat(n.dir); err == nil {
			return nil, fmt.Errorf("harness: %s already exists: Options.Dir must not hold an earlier cluster", n.dir)
		}
		n.out = newTailWriter(c.sink, "["+n.label+"] ")
		return n, os.MkdirAll(n.dir, 0o755)
	}

	var voters string
	if c.zk {
		zk, err := newNode(controllerID, zkRole, 0, ports[0])
		if err != nil {
			return err
		}
		zk.label = c.name + " zookeeper"
		c.controller = zk
		for i := range opts.Brokers {
			n, err := newNode(i+1, "broker", ports[i+1], 0)
			if err != nil {
				return err
			}
			c.brokers = append(c.brokers, n)
		}
	} else if opts.Brokers == 1 {
		n, err := newNode(1, "broker,controller", ports[0], ports[1])
		if err != nil {
			return err
		}
		voters = fmt.Sprintf("1@127.0.0.1:%d", n.cport)
		c.brokers = []*node{n}
	} else {
		ctl, err := newNode(controllerID, "controller", 0, ports[0])
		if err != nil {
			return err
		}
		voters = fmt.Sprintf("%d@127.0.0.1:%d", controllerID, ctl.cport)
		c.controller = ctl
		for i := range opts.Brokers {
			n, err := newNode(i+1, "broker", ports[i+1], 0)
			if err != nil {
				return err
			}
			c.brokers = append(c.brokers, n)
		}
	}
	for i, n := range c.brokers {
		if i < len(proxyPorts) {
			n.advPort = proxyPorts[i]
		}
		n.listeners = map[string]int{}
		for j, l := range opts.Listeners {
			n.listeners[l] = listenerPorts[i*len(opts.Listeners)+j]
		}
		if i < len(listenerProxyPorts) {
			n.listenerProxyPort = listenerProxyPorts[i]
		}
	}
	for _, n := range c.nodes() {
		if n.roles == zkRole {
			if err := writeZooKeeperConfig(n); err != nil {
				return err
			}
			continue
		}
		props := map[string]string{}
		for k, v := range common {
			props[k] = v
		}
		for k, v := range opts.BrokerProps {
			props[k] = v
		}
		if c.zk {
			props["broker.id"] = strconv.Itoa(n.id)
			props["zookeeper.connect"] = fmt.Sprintf("127.0.0.1:%d", c.controller.cport)
		} else {
			props["process.roles"] = n.roles
			props["node.id"] = strconv.Itoa(n.id)
			props["controller.quorum.voters"] = voters
		}
		props["log.dirs"] = filepath.Join(n.dir, "data")
		var listeners []string
		if n.port != 0 {
			listeners = append(listeners, fmt.Sprintf("PLAINTEXT://%s", net.JoinHostPort(n.host, strconv.Itoa(n.port))))
			advertised := []string{fmt.Sprintf("PLAINTEXT://%s", n.addr())}
			for _, l := range opts.Listeners {
				listeners = append(listeners, fmt.Sprintf("%s://127.0.0.1:%d", l, n.listeners[l]))
				adv := n.listeners[l]
				if l == proxiedListener {
					adv = n.listenerProxyPort
				}
				advertised = append(advertised, fmt.Sprintf("%s://127.0.0.1:%d", l, adv))
			}
			props["advertised.listeners"] = strings.Join(advertised, ",")
			props["inter.broker.listener.name"] = "PLAINTEXT"
		}
		if n.cport != 0 {
			listeners = append(listeners, fmt.Sprintf("CONTROLLER://127.0.0.1:%d", n.cport))
		}
		props["listeners"] = strings.Join(listeners, ",")
		if err := writeProperties(n.config(), props); err != nil {
			return err
		}
	}
	return nil
}

// format runs StorageTool on every node in parallel (KRaft only).
func (c *Cluster) format(ctx context.Context) error {
	if c.zk {
		return nil
	}
	nodes := c.nodes()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			argv := append(jvmArgs(c.home, c.classpath, false, "-Xmx256m"), storageTool,
				"format", "-t", c.clusterID, "-c", n.config())
			argv = append(argv, c.formatArgs...)
			cmd := exec.CommandContext(ctx, c.java, argv...)
			cmd.SysProcAttr = childAttr()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("harness: formatting %s storage failed (%v):\n%s", n.label, err, out)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// nodes lists the controller-only node (if any) and then the brokers.
func (c *Cluster) nodes() []*node {
	if c.controller == nil {
		return c.brokers
	}
	return append([]*node{c.controller}, c.brokers...)
}

// Bootstrap returns all brokers as "127.0.0.1:port,..." for clients'
// bootstrap.servers.
func (c *Cluster) Bootstrap() string {
	return strings.Join(c.BrokerAddrs(), ",")
}

// BrokerAddrs returns each broker's "127.0.0.1:port"; index i is broker i.
// A broker keeps its address across restarts.
func (c *Cluster) BrokerAddrs() []string {
	addrs := make([]string, len(c.brokers))
	for i, n := range c.brokers {
		addrs[i] = n.addr()
	}
	return addrs
}

// proxiedListener is the Options.Listeners name of the listener reached
// through ListenerProxy.
const proxiedListener = "PROXIED"

// ListenerAddrs returns each broker's "127.0.0.1:port" on the extra
// listener named name (Options.Listeners; for PROXIED, its proxy's); nil
// if there is none.
func (c *Cluster) ListenerAddrs(name string) []string {
	var addrs []string
	for _, n := range c.brokers {
		if name == proxiedListener && n.listenerProxy != nil {
			addrs = append(addrs, n.listenerProxy.Addr())
		} else if p, ok := n.listeners[name]; ok {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", p))
		}
	}
	return addrs
}

// ClusterID returns the KRaft cluster ID the storage was formatted with,
// or in ZooKeeper mode the one the brokers created.
func (c *Cluster) ClusterID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clusterID
}

// Dir returns the folder holding the nodes' configs, data and default log.
func (c *Cluster) Dir() string {
	return c.dir
}

func (c *Cluster) broker(i int) (*node, error) {
	if i < 0 || i >= len(c.brokers) {
		return nil, fmt.Errorf("harness: broker index %d out of range: cluster %s has brokers 0..%d", i, c.name, len(c.brokers)-1)
	}
	return c.brokers[i], nil
}

// BrokerPID returns the process ID of broker i's running JVM, for
// measuring its CPU time and memory (/proc); an error when the index is
// out of range or the broker is not running.
func (c *Cluster) BrokerPID(i int) (int, error) {
	n, err := c.broker(i)
	if err != nil {
		return 0, err
	}
	p := c.running(n)
	if p == nil {
		return 0, fmt.Errorf("harness: broker %d of cluster %s is not running", i, c.name)
	}
	return p.cmd.Process.Pid, nil
}

// ListenerProxy returns the proxy in front of broker i's PROXIED
// listener, or nil when Options.Listeners has none.
func (c *Cluster) ListenerProxy(i int) *Proxy {
	n, err := c.broker(i)
	if err != nil {
		return nil
	}
	return n.listenerProxy
}

// Proxy returns the proxy in front of broker i, or nil when the cluster was
// started without Options.Proxy.
func (c *Cluster) Proxy(i int) *Proxy {
	n, err := c.broker(i)
	if err != nil {
		return nil
	}
	return n.proxy
}

// StopBroker shuts broker i down with SIGTERM (a controlled shutdown) and
// waits for it to exit. After 20 s, or when ctx ends first, it kills the
// JVM and returns an error saying so.
func (c *Cluster) StopBroker(ctx context.Context, i int) error {
	n, err := c.broker(i)
	if err != nil {
		return err
	}
	p := c.takeProc(n)
	if p == nil {
		return fmt.Errorf("harness: %s is not running", n.label)
	}
	c.note("%s: SIGTERM", n.label)
	p.signal(false)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
		c.note("%s: stopped", n.label)
		return nil
	case <-timer.C:
		err = fmt.Errorf("harness: %s ignored SIGTERM for %s and was killed", n.label, stopTimeout)
	case <-ctx.Done():
		err = fmt.Errorf("harness: stopping %s: %w (killed it)", n.label, ctx.Err())
	}
	p.kill()
	c.note("%s: killed", n.label)
	return err
}

// KillBroker kills broker i with SIGKILL and waits for it to exit.
func (c *Cluster) KillBroker(i int) error {
	n, err := c.broker(i)
	if err != nil {
		return err
	}
	p := c.takeProc(n)
	if p == nil {
		return fmt.Errorf("harness: %s is not running", n.label)
	}
	p.kill()
	c.note("%s: killed", n.label)
	return nil
}

// StartBroker restarts stopped broker i with its ports and data, and waits
// until every running broker lists it in metadata.
func (c *Cluster) StartBroker(ctx context.Context, i int) error {
	n, err := c.broker(i)
	if err != nil {
		return err
	}
	if err := c.launch(n); err != nil {
		return err
	}
	return c.waitReady(ctx)
}

// Close kills every JVM of the cluster, waits for them to exit and removes
// the temporary folder. It is idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var procs []*process
	for _, n := range c.nodes() {
		if n.proc != nil {
			procs = append(procs, n.proc)
			n.proc = nil
		}
	}
	c.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
	var errs []error
	for _, n := range c.brokers {
		for _, p := range []*Proxy{n.proxy, n.listenerProxy} {
			if p != nil {
				errs = append(errs, p.Close())
			}
		}
	}
	if c.logFile != nil {
		errs = append(errs, c.logFile.Close())
	}
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}

// note writes a harness event into the cluster log, between the JVM lines.
func (c *Cluster) note(format string, args ...any) {
	fmt.Fprintf(c.sink, "[%s harness] %s %s\n", c.name, time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// newClusterID returns a random KRaft cluster ID: 16 bytes, URL-safe
// base64 without padding, not starting with '-' (Kafka's own rule, so the
// ID never reads as a command-line flag).
func newClusterID() (string, error) {
	for {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("harness: cluster id: %w", err)
		}
		if id := base64.RawURLEncoding.EncodeToString(b[:]); id[0] != '-' {
			return id, nil
		}
	}
}

// FreeAddr returns a loopback address whose port was free just now, for a
// process the caller starts (a kmirror daemon's HTTP or raft listener).
func FreeAddr() (string, error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), nil
}

// Listening ports come from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default). A port from that
// range, freed by a killed broker or daemon, can meanwhile become the local
// port of some outgoing connection, and the restart then fails to bind it
// (EADDRINUSE); below the range nothing but a listener takes it.
const lowestListenPort = 15000

var (
	portsMu sync.Mutex
	// portsGiven are the ports this process handed out, never given twice:
	// a restarted process binds its old port again.
	portsGiven = map[int]bool{}
)

// freePorts reserves n distinct loopback ports by listening on them all at
// once, then releases them for the JVMs to bind.
func freePorts(n int) ([]int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	lo, hi := lowestListenPort, ephemeralLow()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0" // the kernel's choice: the range below is too small or used up
		if hi-lo >= 1000 && tries < 1000 {
			addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+mrand.IntN(hi-lo)))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "127.0.0.1:0" {
				return nil, fmt.Errorf("harness: no free loopback port: %w", err)
			}
			continue // taken: try another
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		if portsGiven[port] {
			continue
		}
		portsGiven[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range, or
// lowestListenPort (no range below it) where that cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lowestListenPort
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lowestListenPort
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return lowestListenPort
	}
	return low
}

func writeProperties(path string, props map[string]string) error {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("# written by kmirror integration/harness\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, props[k])
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	return nil
}
