// Command demo shows kmirror end to end on one machine (`make demo`): it
// starts a source and a destination Kafka cluster, produces orders into a
// topic on the source, runs a group of three kmirror daemons (one config
// file each), sets up the mirror with the kmirror CLI and prints `kmirror
// members` and `kmirror describe` while the topic is mirrored. Part way
// through it kills one member (SIGKILL) and shows the others take its
// partitions over; at the end it reads the destination back and checks
// every record arrived exactly once.
//
// It runs until Ctrl-C or for DEMO_SECONDS (default 60) once the backlog is
// mirrored, then shuts everything down and exits 0. On a failure it prints
// the end of the daemon logs, keeps the demo folder for inspection and
// exits 1. Either way no JVM is left running.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kmirror/kmirror/integration/harness"
)

const (
	topic      = "demo"
	partitions = 6
	members    = 3
	mirror     = "demo"
	backlog    = 3000 // records produced before mirroring starts
	perSecond  = 5    // records produced per second while the demo runs
	logLines   = 40   // daemon log lines printed on failure
)

func main() {
	os.Exit(run())
}

func run() int {
	flags := flag.NewFlagSet("demo", flag.ContinueOnError)
	kmirrorBin := flags.String("kmirror", "bin/kmirror", "path of the kmirror binary (make build)")
	if err := flags.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	seconds, err := demoSeconds()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		return 2
	}
	bin, err := filepath.Abs(*kmirrorBin)
	if err == nil {
		_, err = os.Stat(bin)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: kmirror binary %s: %v: run make build, or pass --kmirror PATH\n", *kmirrorBin, err)
		return 2
	}

	// The first Ctrl-C (or SIGTERM) ends the demo in order.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	d := &demo{bin: bin}
	defer d.close()
	err = d.run(ctx, stopSignals, time.Duration(seconds)*time.Second)
	if err == nil {
		return 0
	}
	if errors.Is(err, errInterrupted) {
		say("%v; shutting down", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
	d.printLogTail()
	if d.dir != "" {
		fmt.Fprintf(os.Stderr, "kept %s (daemon config, data and log) for inspection\n", d.dir)
		d.keepDir = true
	}
	return 1
}

// demoSeconds reads DEMO_SECONDS: how long the demo keeps running once the
// backlog is mirrored.
func demoSeconds() (int, error) {
	text := os.Getenv("DEMO_SECONDS")
	if text == "" {
		return 60, nil
	}
	n, err := strconv.Atoi(text)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("DEMO_SECONDS=%q: want a whole number of seconds greater than 0, such as 60", text)
	}
	return n, nil
}

// demo holds what the demo started, so that close can undo it.
type demo struct {
	bin      string // kmirror binary
	dir      string // configs, mirror properties, daemon data and logs
	keepDir  bool
	servers  string // every member's HTTP API, comma-separated (--server)
	src, dst *harness.Cluster
	members  []*member
	// died receives the name and exit status of a member that exited
	// without being told to.
	died     chan string
	writer   *kafka.Writer
	produced int
	killed   string // the member the demo killed
}

// member is one kmirror daemon of the demo's group.
type member struct {
	id, server string // node_id, HTTP API URL
	cmd        *exec.Cmd
	exited     chan error
	stopping   atomic.Bool // the demo ends it: its exit is no failure
}

// errInterrupted ends the set-up early on Ctrl-C or SIGTERM.
var errInterrupted = errors.New("interrupted during set-up")

func (d *demo) run(ctx context.Context, stopSignals func(), duration time.Duration) error {
	if err := d.setUp(ctx); err != nil {
		if ctx.Err() != nil {
			return errInterrupted
		}
		return err
	}
	// From here on the first signal ends the demo normally. A second one,
	// while it shuts down, kills the JVMs at once.
	stop := context.AfterFunc(ctx, func() {
		harness.CloseOnSignal(d.src, d.dst)
		stopSignals()
	})
	defer stop()

	say("backlog mirrored; producing %d records/s and describing every 5s for %s (Ctrl-C stops)", perSecond, duration)
	if err := d.live(ctx, duration/3); err != nil {
		return err
	}
	if ctx.Err() == nil {
		if err := d.killOne(ctx); err != nil {
			return err
		}
		if err := d.live(ctx, duration-duration/3); err != nil {
			return err
		}
	}
	// ctx may be cancelled by now: the shutdown gets its own deadline.
	stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	say("stopped producing after %d records; waiting until the last ones are mirrored", d.produced)
	rows, err := d.waitCaughtUp(stopCtx, time.Minute)
	if err != nil {
		return err
	}
	mirrored := 0
	for _, r := range rows {
		n, _ := strconv.Atoi(r["DESTINATION-OFFSET"])
		mirrored += n
	}
	if mirrored != d.produced {
		return fmt.Errorf("the destination ends at %d records in total, but %d were produced", mirrored, d.produced)
	}
	say("reading the destination back to check every order arrived exactly once")
	if err := d.checkExactlyOnce(stopCtx); err != nil {
		return err
	}
	say("all %d orders are on the destination exactly once, in order per key", d.produced)
	say("stopping the kmirror members (SIGTERM)")
	return d.stopMembers(60 * time.Second)
}

// setUp starts both clusters, produces the backlog, starts the daemon,
// creates the mirror and waits until the backlog is mirrored.
func (d *demo) setUp(ctx context.Context) error {
	var err error
	say("starting source Kafka cluster")
	if d.src, err = startCluster(ctx, "source"); err != nil {
		return err
	}
	say("starting destination Kafka cluster")
	if d.dst, err = startCluster(ctx, "destination"); err != nil {
		return err
	}

	say("creating topic %s (%d partitions) on the source", topic, partitions)
	if err := d.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		return err
	}
	d.writer = &kafka.Writer{
		Addr:         kafka.TCP(d.src.BrokerAddrs()...),
		Topic:        topic,
		Balancer:     &kafka.Murmur2Balancer{}, // a key's partition as the Java producer picks it
		BatchTimeout: 10 * time.Millisecond,
		RequiredAcks: kafka.RequireAll,
		Compression:  kafka.Lz4,
		Transport:    &kafka.Transport{ClientID: "kmirror-demo"},
	}
	say("producing %d order records (key, JSON value, header) into %s", backlog, topic)
	if err := d.produce(ctx, backlog); err != nil {
		return err
	}

	if d.dir, err = os.MkdirTemp("", "kmirror-demo-"); err != nil {
		return err
	}
	say("writing kmirror-1.yaml .. kmirror-%d.yaml and source.properties into %s", members, d.dir)
	if err := d.writeConfig(); err != nil {
		return err
	}
	say("starting %d kmirror daemons (logs: %s)", members, filepath.Join(d.dir, "kmirror-N.log"))
	if err := d.startMembers(ctx); err != nil {
		return err
	}
	if _, err := d.cli(ctx, "members"); err != nil {
		return err
	}
	say("setting up the mirror with the kmirror CLI (any member answers; writes go to the raft leader)")
	if _, err := d.cli(ctx, "create", "--mirror", mirror, "--mirror-config", filepath.Join(d.dir, "source.properties")); err != nil {
		return err
	}
	if _, err := d.cli(ctx, "add", "--mirror", mirror, "--topic", topic); err != nil {
		return err
	}
	say("waiting until every partition shows LAG 0 (kmirror describe every 2s)")
	_, err = d.waitCaughtUp(ctx, 3*time.Minute)
	return err
}

func startCluster(ctx context.Context, name string) (*harness.Cluster, error) {
	start := time.Now()
	c, err := harness.Start(ctx, harness.Options{Name: name})
	if err != nil {
		return nil, err
	}
	fmt.Printf("   %s cluster ready at %s in %s\n", name, c.Bootstrap(), time.Since(start).Round(100*time.Millisecond))
	return c, nil
}

// produce writes n more orders, numbered on from the earlier ones.
func (d *demo) produce(ctx context.Context, n int) error {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		id := d.produced + i
		customer := fmt.Sprintf("customer-%03d", id%50)
		msgs[i] = kafka.Message{
			Key: []byte(customer),
			Value: fmt.Appendf(nil, `{"order_id":%d,"customer":%q,"amount_cents":%d,"created_at":%q}`,
				id, customer, 100+id*37%9900, time.Now().UTC().Format(time.RFC3339Nano)),
			Headers: []kafka.Header{{Key: "content-type", Value: []byte("application/json")}},
		}
	}
	if err := d.writer.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("producing into %s on the source: %w", topic, err)
	}
	d.produced += n
	return nil
}

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

// cli runs the kmirror CLI against the daemon, echoing the command line
// and its output, and returns the output.
func (d *demo) cli(ctx context.Context, args ...string) (string, error) {
	fmt.Printf("$ kmirror %s\n", strings.Join(args, " "))
	out, err := exec.CommandContext(ctx, d.bin, append([]string{"--server", d.servers}, args...)...).CombinedOutput()
	fmt.Print(string(out))
	if err != nil {
		return "", fmt.Errorf("kmirror %s: %w", args[0], err)
	}
	return string(out), nil
}

// describe prints `kmirror describe`, returns its rows and reports whether
// every partition of the demo topic is MIRRORING with LAG 0. A DIVERGED
// partition is an error: it needs an operator.
func (d *demo) describe(ctx context.Context) (rows []map[string]string, caughtUp bool, err error) {
	out, err := d.cli(ctx, "describe", "--mirror", mirror)
	if err != nil {
		return nil, false, err
	}
	rows = parseTable(out)
	caughtUp = len(rows) == partitions
	for _, r := range rows {
		if r["STATE"] == "DIVERGED" {
			return nil, false, fmt.Errorf("partition %s/%s is DIVERGED: %s", r["TOPIC"], r["PARTITION"], r["REASON"])
		}
		if r["STATE"] != "MIRRORING" || r["LAG"] != "0" || r["SOURCE-OFFSET"] != r["DESTINATION-OFFSET"] {
			caughtUp = false
		}
	}
	return rows, caughtUp, nil
}

// parseTable turns the describe table into one map per row, keyed by the
// header. REASON, the last column, may hold spaces.
func parseTable(out string) []map[string]string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := strings.Fields(lines[0])
	var rows []map[string]string
	for _, line := range lines[1:] {
		fields := strings.Fields(line)
		row := map[string]string{}
		for i, name := range header {
			switch {
			case i >= len(fields):
			case i == len(header)-1:
				row[name] = strings.Join(fields[i:], " ")
			default:
				row[name] = fields[i]
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// waitCaughtUp describes every 2 s until every partition shows LAG 0 and
// returns the last rows.
func (d *demo) waitCaughtUp(ctx context.Context, timeout time.Duration) ([]map[string]string, error) {
	deadline := time.After(timeout)
	for {
		rows, caughtUp, err := d.describe(ctx)
		if err != nil || caughtUp {
			return rows, err
		}
		select {
		case who := <-d.died:
			return nil, fmt.Errorf("kmirror member %s exited", who)
		case <-deadline:
			return nil, fmt.Errorf("the mirror did not catch up within %s", timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// live produces a few records per second and describes every 5 s until
// duration has passed or ctx is cancelled (Ctrl-C), which both end the demo
// normally.
func (d *demo) live(ctx context.Context, duration time.Duration) error {
	end := time.After(duration)
	produceTick := time.NewTicker(time.Second)
	defer produceTick.Stop()
	describeTick := time.NewTicker(5 * time.Second)
	defer describeTick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Println()
			say("interrupted")
			return nil
		case <-end:
			return nil
		case who := <-d.died:
			return fmt.Errorf("kmirror member %s exited", who)
		case <-produceTick.C:
			if err := d.produce(ctx, perSecond); err != nil && ctx.Err() == nil {
				return err
			}
		case <-describeTick.C:
			fmt.Printf("   %d records produced so far\n", d.produced)
			if _, _, err := d.describe(ctx); err != nil && ctx.Err() == nil {
				return err
			}
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

// checkExactlyOnce reads every destination partition and requires each
// order produced to be there once, with every key's orders in the order
// they were produced.
func (d *demo) checkExactlyOnce(ctx context.Context) error {
	seen := make([]int, d.produced)
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", d.dst.BrokerAddrs()[0], topic, p)
		if err != nil {
			return fmt.Errorf("reading destination partition %d: %w", p, err)
		}
		last := map[string]int{}
		end, err := conn.ReadLastOffset()
		for off := int64(0); err == nil && off < end; {
			if err = conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				break
			}
			batch := conn.ReadBatch(1, 10<<20)
			for {
				msg, rerr := batch.ReadMessage()
				if rerr != nil {
					break
				}
				off = msg.Offset + 1
				var id int
				if _, serr := fmt.Sscanf(string(msg.Value), `{"order_id":%d,`, &id); serr != nil || id < 0 || id >= d.produced {
					conn.Close()
					return fmt.Errorf("destination partition %d offset %d holds an unexpected value %q", p, msg.Offset, msg.Value)
				}
				seen[id]++
				if prev, ok := last[string(msg.Key)]; ok && prev > id {
					conn.Close()
					return fmt.Errorf("destination partition %d: order %d of %s after order %d", p, id, msg.Key, prev)
				}
				last[string(msg.Key)] = id
			}
			err = batch.Close()
		}
		conn.Close()
		if err != nil {
			return fmt.Errorf("reading destination partition %d: %w", p, err)
		}
	}
	for id, n := range seen {
		if n != 1 {
			return fmt.Errorf("order %d is on the destination %d times, want exactly once", id, n)
		}
	}
	return nil
}

// close kills whatever is still running and removes the demo folder unless
// a failure asked to keep it.
func (d *demo) close() {
	for _, m := range d.members {
		if m.cmd != nil {
			m.stopping.Store(true)
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
	}
	if d.writer != nil {
		_ = d.writer.Close()
		d.writer.Transport.(*kafka.Transport).CloseIdleConnections()
	}
	for _, c := range []struct {
		name    string
		cluster *harness.Cluster
	}{{"source", d.src}, {"destination", d.dst}} {
		if c.cluster != nil {
			say("stopping %s Kafka cluster", c.name)
			if err := c.cluster.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "demo:", err)
			}
		}
	}
	if d.dir != "" && !d.keepDir {
		_ = os.RemoveAll(d.dir)
	}
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

func say(format string, args ...any) {
	fmt.Printf("== "+format+"\n", args...)
}
