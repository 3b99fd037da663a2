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
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
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

func say(format string, args ...any) {
	fmt.Printf("== "+format+"\n", args...)
}
