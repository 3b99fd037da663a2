package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

// The demo's kmirror members: their configs, starting, the kill -9 of one,
// stopping, and their logs.

func (d *demo) writeConfig() error {
	type addrs struct{ http, raft string }
	as := make([]addrs, members)
	var peers, servers []string
	for i := range as {
		var err error
		if as[i].http, err = harness.FreeAddr(); err != nil {
			return err
		}
		if as[i].raft, err = harness.FreeAddr(); err != nil {
			return err
		}
		id := fmt.Sprintf("kmirror-%d", i+1)
		peers = append(peers, fmt.Sprintf("  - {id: %s, raft: \"%s\", http: \"%s\"}", id, as[i].raft, as[i].http))
		servers = append(servers, "http://"+as[i].http)
		d.members = append(d.members, &member{id: id, server: "http://" + as[i].http})
	}
	d.servers = strings.Join(servers, ",")
	for i, m := range d.members {
		config := fmt.Sprintf(`node_id: %s
data_dir: %s
http_listen: %s
raft_listen: %s
checkpoint_interval: 1s
# Short leases so the demo shows a takeover within seconds (default 10s).
lease_ttl: 6s
lease_margin: 3s
peers:
%s
destination:
  bootstrap_servers: ["%s"]
`, m.id, filepath.Join(d.dir, m.id+"-data"), as[i].http, as[i].raft, strings.Join(peers, "\n"), strings.Join(d.dst.BrokerAddrs(), `", "`))
		if err := os.WriteFile(filepath.Join(d.dir, m.id+".yaml"), []byte(config), 0o644); err != nil {
			return err
		}
	}
	props := "bootstrap.servers=" + d.src.Bootstrap() + "\n"
	return os.WriteFile(filepath.Join(d.dir, "source.properties"), []byte(props), 0o644)
}

// startMembers starts every member (a new group forms once a quorum is up)
// and waits until each answers /readyz with 200.
func (d *demo) startMembers(ctx context.Context) error {
	d.died = make(chan string, members)
	for _, m := range d.members {
		if err := d.spawn(m); err != nil {
			return err
		}
	}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.After(90 * time.Second)
	for _, m := range d.members {
		for ready := false; !ready; {
			resp, err := client.Get(m.server + "/readyz")
			if err == nil {
				resp.Body.Close()
				ready = resp.StatusCode == http.StatusOK
			}
			if ready {
				fmt.Printf("   %s ready at %s\n", m.id, m.server)
				break
			}
			select {
			case who := <-d.died:
				return fmt.Errorf("%s exited during start-up", who)
			case <-deadline:
				return fmt.Errorf("%s not ready after 90s (GET /readyz)", m.id)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

func (d *demo) spawn(m *member) error {
	logFile, err := os.Create(filepath.Join(d.dir, m.id+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(d.bin, "daemon", "--config", filepath.Join(d.dir, m.id+".yaml"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, so Ctrl-C reaches only the demo, which stops the
	// daemons in order; they die with the demo if the demo is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting %s: %w", d.bin, err)
	}
	m.cmd, m.exited = cmd, make(chan error, 1)
	go func() {
		err := cmd.Wait()
		logFile.Close()
		if !m.stopping.Load() {
			d.died <- fmt.Sprintf("%s (%v)", m.id, err)
		}
		m.exited <- err
	}()
	return nil
}

// killOne kills, with SIGKILL, the member that leases the most partitions
// (not the raft leader, so the takeover shows at the lease TTL), then
// describes until the others have taken its partitions over.
func (d *demo) killOne(ctx context.Context) error {
	rows, _, err := d.describe(ctx)
	if err != nil {
		return err
	}
	out, err := d.cli(ctx, "members")
	if err != nil {
		return err
	}
	leader := ""
	for _, r := range parseTable(out) {
		if r["ROLE"] == "leader" {
			leader = r["ID"]
		}
	}
	count := map[string]int{}
	for _, r := range rows {
		count[r["OWNER"]]++
	}
	var victim *member
	for _, m := range d.members {
		if m.id != leader && (victim == nil || count[m.id] > count[victim.id]) {
			victim = m
		}
	}
	say("killing %s with SIGKILL (it leases %d partitions); the others take them over after lease_ttl (6s here)", victim.id, count[victim.id])
	victim.stopping.Store(true)
	_ = victim.cmd.Process.Kill()
	<-victim.exited
	victim.cmd, d.killed = nil, victim.id
	start := time.Now()
	deadline := time.After(90 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return nil
		case who := <-d.died:
			return fmt.Errorf("%s exited", who)
		case <-deadline:
			return fmt.Errorf("the partitions of %s were not taken over within 90s", victim.id)
		case <-time.After(2 * time.Second):
		}
		// Records keep coming during the takeover: the exactly-once check
		// at the end covers them.
		if err := d.produce(ctx, 2*perSecond); err != nil && ctx.Err() == nil {
			return err
		}
		rows, _, err := d.describe(ctx)
		if err != nil {
			return err
		}
		moved := len(rows) == partitions
		for _, r := range rows {
			if r["OWNER"] == victim.id || r["STATE"] != "MIRRORING" {
				moved = false
			}
		}
		if moved {
			say("every partition of %s was taken over in %s; the resumes verified the destination against the source", victim.id, time.Since(start).Round(100*time.Millisecond))
			_, err := d.cli(ctx, "members")
			return err
		}
	}
}

// stopMembers sends SIGTERM to every running member and requires clean
// exits within timeout.
func (d *demo) stopMembers(timeout time.Duration) error {
	for _, m := range d.members {
		if m.cmd == nil {
			continue
		}
		m.stopping.Store(true)
		if err := m.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return fmt.Errorf("signalling %s: %w", m.id, err)
		}
	}
	for _, m := range d.members {
		if m.cmd == nil {
			continue
		}
		select {
		case err := <-m.exited:
			m.cmd = nil
			if err != nil {
				return fmt.Errorf("%s exited with %v after SIGTERM", m.id, err)
			}
		case <-time.After(timeout):
			return fmt.Errorf("%s did not exit within %s of SIGTERM", m.id, timeout)
		}
	}
	return nil
}

// printLogTail prints the last lines of each member's log to stderr.
func (d *demo) printLogTail() {
	for _, m := range d.members {
		path := filepath.Join(d.dir, m.id+".log")
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		var tail []string
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			tail = append(tail, sc.Text())
			if len(tail) > logLines {
				tail = tail[1:]
			}
		}
		f.Close()
		fmt.Fprintf(os.Stderr, "--- last %d lines of %s ---\n%s\n", len(tail), path, strings.Join(tail, "\n"))
	}
}
