package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

const (
	readyTimeout = 90 * time.Second
	stopTimeout  = 60 * time.Second
)

// member is one kmirror daemon under test, running as its own process
// with its log in the bench folder.
type member struct {
	id      string
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process is reaped
	err     error         // exit status; read after done
	logPath string
	// profile is the CPU profile the daemon writes ("": none).
	profile string
	client  *api.Client
}

// group is the kmirror members under test.
type group struct {
	members []*member
	// client reaches any member (writes are forwarded to the leader).
	client *api.Client
}

// startGroup writes a config per member into dir (a shared peers list) and
// starts n `kmirror daemon` processes, then waits until every /readyz
// answers (a new group forms once a quorum is up).
//
// With profile set each member writes a Go CPU profile of its whole run to
// dir/<id>.cpu.pprof (member.profile). extra is more top-level YAML of
// every member's config ("" for none).
func startGroup(ctx context.Context, bin, dir, destination, destSecurity, extra string, n int, profile bool) (*group, error) {
	type addrs struct{ http, raft string }
	as := make([]addrs, n)
	var peers, servers []string
	for i := range as {
		var err error
		if as[i].http, err = harness.FreeAddr(); err != nil {
			return nil, err
		}
		if as[i].raft, err = harness.FreeAddr(); err != nil {
			return nil, err
		}
		peers = append(peers, fmt.Sprintf("  - {id: bench-%d, raft: %q, http: %q}", i+1, as[i].raft, as[i].http))
		servers = append(servers, "http://"+as[i].http)
	}
	g := &group{}
	var err error
	if g.client, err = api.NewClient(strings.Join(servers, ","), 30*time.Second); err != nil {
		return nil, err
	}
	for i := range as {
		id := fmt.Sprintf("bench-%d", i+1)
		cfg := fmt.Sprintf(`node_id: %s
data_dir: %s
http_listen: %s
raft_listen: %s
checkpoint_interval: 1s
memory_budget: 256MiB
log_level: info
%speers:
%s
destination:
  bootstrap_servers: [%s]
%s`, id, filepath.Join(dir, id+"-data"), as[i].http, as[i].raft, extra, strings.Join(peers, "\n"), destination, destSecurity)
		m, err := spawnMember(bin, dir, id, cfg, "http://"+as[i].http, profile)
		if err != nil {
			g.kill()
			return nil, err
		}
		g.members = append(g.members, m)
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for _, m := range g.members {
		for {
			err := m.client.Ready(ctx)
			if err == nil {
				break
			}
			select {
			case <-m.done:
				g.kill()
				return nil, fmt.Errorf("kmirror daemon %s exited during start-up (%v); its log %s ends:\n%s", m.id, m.err, m.logPath, m.logTail(40))
			case <-ctx.Done():
				g.kill()
				return nil, fmt.Errorf("kmirror daemon %s not ready within %s (%v); its log %s ends:\n%s", m.id, readyTimeout, err, m.logPath, m.logTail(40))
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return g, nil
}

// spawnMember writes cfg and starts one daemon with it.
func spawnMember(bin, dir, id, cfg, url string, profile bool) (*member, error) {
	cfgPath := filepath.Join(dir, id+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	m := &member{id: id, logPath: filepath.Join(dir, id+".log"), done: make(chan struct{})}
	var err error
	if m.client, err = api.NewClient(url, 30*time.Second); err != nil {
		return nil, err
	}
	logf, err := os.Create(m.logPath)
	if err != nil {
		return nil, err
	}
	args := []string{"daemon", "--config", cfgPath}
	if profile {
		m.profile = filepath.Join(dir, id+".cpu.pprof")
		args = append(args, "--cpu-profile", m.profile)
	}
	m.cmd = exec.Command(bin, args...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	// Its own process group, so a Ctrl-C at the terminal reaches only the
	// bench, which then stops the daemon; killed if the bench dies.
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		m.err = m.cmd.Wait()
		logf.Close()
		close(m.done)
	}()
	return m, nil
}

// sample sums the members' CPU time and takes the largest peak RSS.
func (g *group) sample(ticksPerSecond int64) (procSample, error) {
	var total procSample
	for _, m := range g.members {
		s, err := sample(m.pid(), ticksPerSecond)
		if err != nil {
			return procSample{}, fmt.Errorf("%s: %w", m.id, err)
		}
		total.CPU += s.CPU
		total.PeakRSS = max(total.PeakRSS, s.PeakRSS)
	}
	return total, nil
}

// exited returns an error naming the first member that has exited, or nil.
func (g *group) exited() error {
	for _, m := range g.members {
		select {
		case <-m.done:
			return fmt.Errorf("kmirror daemon %s exited (%v)", m.id, m.err)
		default:
		}
	}
	return nil
}

// stop stops every member (SIGTERM) and returns the first failure.
func (g *group) stop() error {
	var errs []error
	for _, m := range g.members {
		if err := m.stop(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.id, err))
		}
	}
	return errors.Join(errs...)
}

func (g *group) kill() {
	for _, m := range g.members {
		m.kill()
	}
}

func (m *member) pid() int { return m.cmd.Process.Pid }

// stop sends SIGTERM and waits for the exit; after stopTimeout it kills the
// daemon and says so.
func (m *member) stop() error {
	select {
	case <-m.done:
		return fmt.Errorf("kmirror daemon had already exited (%v)", m.err)
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
		if m.err != nil {
			return fmt.Errorf("kmirror daemon exited with %v after SIGTERM", m.err)
		}
		return nil
	case <-time.After(stopTimeout):
		m.kill()
		return fmt.Errorf("kmirror daemon ignored SIGTERM for %s and was killed", stopTimeout)
	}
}

// kill kills the daemon if it still runs and waits until it is reaped.
func (m *member) kill() {
	select {
	case <-m.done:
		return
	default:
	}
	_ = syscall.Kill(-m.pid(), syscall.SIGKILL)
	<-m.done
}

// logTail returns the last lines of the daemon log.
func (m *member) logTail(lines int) string {
	data, err := os.ReadFile(m.logPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", m.logPath, err)
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// fetchConnections is the count of fetch connections the member last
// logged for each source broker (fetch.fetchConnsFor), by broker address.
func (m *member) fetchConnections() map[string]int {
	data, err := os.ReadFile(m.logPath)
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, "fetch connections to a source broker") {
			continue
		}
		var rec struct {
			Broker      string `json:"broker"`
			Connections int    `json:"connections"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Broker != "" {
			out[rec.Broker] = rec.Connections
		}
	}
	return out
}

// logProblems returns the daemon log's warn and error lines (JSON lines
// from zap), at most limit of them, and how many there were in all.
func (m *member) logProblems(limit int) ([]string, int) {
	f, err := os.Open(m.logPath)
	if err != nil {
		return []string{fmt.Sprintf("(cannot read %s: %v)", m.logPath, err)}, 1
	}
	defer f.Close()
	var out []string
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"level":"warn"`) && !strings.Contains(line, `"level":"error"`) &&
			!strings.Contains(line, `"level":"dpanic"`) && !strings.Contains(line, `"level":"panic"`) &&
			!strings.Contains(line, `"level":"fatal"`) && !strings.HasPrefix(line, "panic:") {
			continue
		}
		n++
		if len(out) < limit {
			out = append(out, line)
		}
	}
	return out, n
}

// procSample is one reading of a process's CPU time and peak memory.
type procSample struct {
	CPU     time.Duration // user + system
	PeakRSS int64         // VmHWM in bytes
}

// sample reads /proc/<pid>/stat and /proc/<pid>/status; ticksPerSecond is
// the unit of the CPU times there (see clockTicks).
func sample(pid int, ticksPerSecond int64) (procSample, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	ticks, err := parseStatCPU(string(stat))
	if err != nil {
		return procSample{}, err
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procSample{}, err
	}
	hwm, err := parseStatusHWM(string(status))
	if err != nil {
		return procSample{}, err
	}
	return procSample{CPU: time.Duration(ticks) * time.Second / time.Duration(ticksPerSecond), PeakRSS: hwm}, nil
}

// parseStatCPU returns utime+stime (fields 14 and 15, in clock ticks) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may hold spaces, so fields are counted from the last ')'.
func parseStatCPU(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no command name")
	}
	fields := strings.Fields(stat[i+1:])
	// fields[0] is field 3 (state), so field k is fields[k-3].
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(fields[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: utime %q, stime %q are not numbers", fields[14-3], fields[15-3])
	}
	return utime + stime, nil
}

// parseStatusHWM returns VmHWM (peak resident set) in bytes.
func parseStatusHWM(status string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("/proc status: unexpected VmHWM line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc status: unexpected VmHWM line %q", line)
		}
		return kb << 10, nil
	}
	return 0, errors.New("/proc status: no VmHWM line")
}

// clockTicks returns the kernel's USER_HZ, the unit of /proc CPU times,
// from getconf; 100 (Linux's value on every common architecture) if that
// fails.
func clockTicks() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}

// memberYAML is the top-level config every member gets beyond the
// group's: produce_window when set.
func (b *bench) memberYAML() string {
	if b.cfg.ProduceWindow == 0 {
		return ""
	}
	return fmt.Sprintf("produce_window: %d\n", b.cfg.ProduceWindow)
}
