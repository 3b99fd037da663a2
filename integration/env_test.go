package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// env is shared by every test of the package: one source and one
// destination cluster started once, and the kmirror binary. Tests isolate
// themselves with their own topics.
var env struct {
	src, dst *harness.Cluster
	bin      string
	tmp      string
}

// brokerProps lets the fidelity test send ~1 MiB values and lets old
// backlogs lose their producer state on the destination within a test.
var brokerProps = map[string]string{
	// The broker drops a producer's state once its last batch's newest
	// timestamp is older than producer.id.expiration.ms; checking every
	// second (not every 10 minutes) makes that happen within a test.
	"producer.id.expiration.check.interval.ms": "1000",
	// Size and time retention act within a second, not five minutes.
	"log.retention.check.interval.ms": "1000",
	"message.max.bytes":               "4194304",
	"replica.fetch.max.bytes":         "4194304",
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "kmirror-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getenv("KMIRROR_KEEP_TEST_DIR") == "" {
		defer os.RemoveAll(tmp)
	} else {
		fmt.Fprintln(os.Stderr, "keeping member logs and data in", tmp)
	}
	env.tmp = tmp
	env.bin = filepath.Join(tmp, "kmirror")
	build := exec.Command("go", "build", "-o", env.bin, "github.com/kmirror/kmirror/cmd/kmirror")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build kmirror:", err)
		return 1
	}
	for _, c := range []struct {
		name string
		dst  **harness.Cluster
	}{{"source", &env.src}, {"destination", &env.dst}} {
		cl, err := harness.Start(ctx, harness.Options{Name: c.name, BrokerProps: brokerProps})
		if err != nil {
			fmt.Fprintln(os.Stderr, "start", c.name, "cluster:", err)
			return 1
		}
		defer cl.Close()
		*c.dst = cl
	}
	stop := harness.CloseOnSignal(env.src, env.dst)
	defer stop()
	defer func() {
		if shared != nil {
			shared.kill()
		}
	}()
	return m.Run()
}

// member is a kmirror daemon running as its own process.
type member struct {
	t       testing.TB
	cfgPath string
	logPath string
	url     string
	cmd     *exec.Cmd
	// exited is closed when the process started last has ended, and
	// exitErr is then what Wait returned. A closed channel, not a value:
	// every waiter sees the exit (a start-up failure, then the cleanup's
	// kill, then a failure report).
	exited  chan struct{}
	exitErr error
	client  *api.Client
	src     *harness.Cluster // the source its waits compare with; nil = env.src
	// httpc makes the test's own HTTP requests (TLS settings of an https
	// API).
	httpc *http.Client
}

func freeAddr(t testing.TB) string {
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startMember writes a config and starts a daemon with it; dir keeps its
// raft data across restarts.
// memberOpts adjust a test daemon's config.
type memberOpts struct {
	extra       string // appended top-level YAML
	destination string // bootstrap servers; default the shared destination
	destExtra   string // appended to the destination block, indented
	// httpAddr and raftAddr are chosen by the caller (a group lists them
	// in every member's peers); empty: a free port each.
	httpAddr, raftAddr string
	// noWait starts the process without waiting for /readyz (members of a
	// new group are ready only once a quorum is up).
	noWait bool
	// checkpoint is checkpoint_interval; default 200ms.
	checkpoint string
	// apiTLS: the API is served over TLS (api.tls in extra); the test's
	// clients trust these settings. token is the API's bearer token.
	apiTLS *tls.Config
	token  string
}

// startMember starts a daemon for one test.
func startMember(t testing.TB, name string, o memberOpts) *member {
	t.Helper()
	m := newMember(t, name, o)
	t.Cleanup(func() { m.kill() })
	return m
}

func newMember(t testing.TB, name string, o memberOpts) *member {
	t.Helper()
	dir := filepath.Join(env.tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	httpAddr, raftAddr := o.httpAddr, o.raftAddr
	if httpAddr == "" {
		httpAddr = freeAddr(t)
	}
	if raftAddr == "" {
		raftAddr = freeAddr(t)
	}
	if o.destination == "" {
		o.destination = env.dst.Bootstrap()
	}
	if o.checkpoint == "" {
		o.checkpoint = "200ms"
	}
	cfg := fmt.Sprintf(`node_id: %s
data_dir: %s
http_listen: %s
raft_listen: %s
checkpoint_interval: %s
log_level: info
%sdestination:
  bootstrap_servers: [%s]
%s`, name, filepath.Join(dir, "data"), httpAddr, raftAddr, o.checkpoint, o.extra, o.destination, o.destExtra)
	m := &member{t: t, cfgPath: filepath.Join(dir, "kmirror.yaml"), logPath: filepath.Join(dir, "kmirror.log"),
		url: "http://" + httpAddr, httpc: &http.Client{Timeout: 30 * time.Second}}
	if o.apiTLS != nil {
		m.url = "https://" + httpAddr
		m.httpc.Transport = &http.Transport{TLSClientConfig: o.apiTLS}
	}
	if err := os.WriteFile(m.cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	var err error
	if m.client, err = api.NewClient(m.url, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	m.client = m.client.WithAuth(o.apiTLS, o.token)
	if o.noWait {
		m.spawn()
	} else {
		m.start()
	}
	return m
}

// start starts the daemon and waits until it is ready.
func (m *member) start() {
	m.t.Helper()
	m.spawn()
	m.waitReady()
}

// spawn starts the daemon process.
func (m *member) spawn() {
	m.t.Helper()
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		m.t.Fatal(err)
	}
	m.cmd = exec.Command(env.bin, "daemon", "--config", m.cfgPath)
	// A partition move the data path's tables do not list crashes the
	// member under test (fetch/partition.go) instead of being logged.
	m.cmd.Env = append(os.Environ(), "KMIRROR_STRICT_TRANSITIONS=1")
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	cmd, exited := m.cmd, make(chan struct{})
	m.exited = exited
	go func() {
		m.exitErr = cmd.Wait()
		logf.Close()
		close(exited)
	}()
}

// waitReady waits until /readyz answers 200.
func (m *member) waitReady() {
	m.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := m.httpc.Get(m.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-m.exited:
			m.cmd = nil
			m.t.Fatalf("kmirror daemon exited during start-up (%v); log:\n%s", m.exitErr, m.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("kmirror daemon not ready after 90s; log:\n%s", m.logTail())
		}
	}
}

// logAll is the daemon's whole log, for checks that a line was (or was
// never) logged: the tail may have scrolled past it.
func (m *member) logAll() string {
	b, _ := os.ReadFile(m.logPath)
	return string(b)
}

func (m *member) logTail() string {
	b, _ := os.ReadFile(m.logPath)
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// kill9 kills the daemon with SIGKILL, as a crash would.
func (m *member) kill9() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	m.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		m.t.Errorf("kmirror daemon pid %d still running 30s after SIGKILL", m.cmd.Process.Pid)
	}
	m.cmd = nil
}

func (m *member) kill() {
	if m.cmd != nil {
		m.kill9()
	}
}

// stop sends SIGTERM and requires a clean exit.
func (m *member) stop() {
	m.t.Helper()
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
		m.cmd = nil
		if m.exitErr != nil {
			m.t.Fatalf("kmirror daemon exited with %v after SIGTERM; log:\n%s", m.exitErr, m.logTail())
		}
	case <-time.After(60 * time.Second):
		m.t.Fatalf("kmirror daemon did not exit within 60s of SIGTERM")
	}
}

// sharedMember is the daemon most tests use, with mirror "src" pointing at
// the source cluster.
var shared *member

func sharedMirror(t *testing.T) *member {
	t.Helper()
	if shared != nil && shared.cmd != nil {
		shared.t = t
		return shared
	}
	shared = newMember(t, "shared", memberOpts{})
	err := shared.client.CreateMirror(context.Background(), api.CreateMirrorRequest{
		Name: "src", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	return shared
}
