package harness_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kmirror/kmirror/integration/harness"
)

var (
	singleOnce sync.Once
	single     *harness.Cluster
	singleErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if single != nil {
		if err := single.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing the shared cluster:", err)
			code = 1
		}
	}
	if leaked := childJVMs(); len(leaked) > 0 {
		fmt.Fprintln(os.Stderr, "JVMs left running by the tests:", leaked)
		code = 1
	}
	os.Exit(code)
}

// sharedSingle starts one combined-node cluster on first use; TestMain
// closes it. Tests using it must leave it with its broker running.
func sharedSingle(t *testing.T) *harness.Cluster {
	t.Helper()
	skipShort(t)
	singleOnce.Do(func() {
		start := time.Now()
		single, singleErr = harness.Start(context.Background(), harness.Options{Name: "single"})
		if singleErr == nil {
			t.Logf("1-node cluster %s ready in %s", single.ClusterID(), time.Since(start).Round(time.Millisecond))
		}
	})
	if singleErr != nil {
		t.Fatal(singleErr)
	}
	return single
}

func skipShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real Kafka JVMs")
	}
}

func TestSingleBrokerSurvivesRestart(t *testing.T) {
	c := sharedSingle(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := c.CreateTopic(ctx, "restart", 1, 1, map[string]string{"cleanup.policy": "delete"}); err != nil {
		t.Fatal(err)
	}
	offset := produce(ctx, t, c.BrokerAddrs(), "restart", 0, "before-restart")
	assertRecord(ctx, t, c.BrokerAddrs(), "restart", 0, offset, "before-restart")

	if err := c.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	assertRecord(ctx, t, c.BrokerAddrs(), "restart", 0, offset, "before-restart")
}

func TestJavaConsoleProducer(t *testing.T) {
	c := sharedSingle(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if err := c.CreateTopic(ctx, "from-java", 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	cmd := c.Java(ctx, harness.ConsoleProducer, "--bootstrap-server", c.Bootstrap(), "--topic", "from-java")
	cmd.Stdin = strings.NewReader("hello from java\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ConsoleProducer: %v\n%s", err, out)
	}
	assertRecord(ctx, t, c.BrokerAddrs(), "from-java", 0, 0, "hello from java")
}

func TestThreeBrokersSurviveLeaderKill(t *testing.T) {
	skipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	start := time.Now()
	c, err := harness.Start(ctx, harness.Options{
		Name:    "three",
		Brokers: 3,
		// Fence a dead broker within seconds instead of the default 9 s.
		BrokerProps: map[string]string{
			"broker.heartbeat.interval.ms": "500",
			"broker.session.timeout.ms":    "3000",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("3-broker cluster ready in %s", time.Since(start).Round(time.Millisecond))
	if got := len(strings.Split(c.Bootstrap(), ",")); got != 3 {
		t.Fatalf("Bootstrap() = %q, want 3 addresses", c.Bootstrap())
	}

	if err := c.CreateTopic(ctx, "rf3", 1, 3, map[string]string{"min.insync.replicas": "2"}); err != nil {
		t.Fatal(err)
	}
	addrs := c.BrokerAddrs()
	offset := produce(ctx, t, addrs, "rf3", 0, "replicated")

	leader := leaderIndex(ctx, t, addrs, "rf3")
	if err := c.KillBroker(leader); err != nil {
		t.Fatal(err)
	}
	survivors := append(append([]string{}, addrs[:leader]...), addrs[leader+1:]...)
	assertRecord(ctx, t, survivors, "rf3", 0, offset, "replicated")
	next := produce(ctx, t, survivors, "rf3", 0, "after-kill")
	assertRecord(ctx, t, survivors, "rf3", 0, next, "after-kill")

	if err := c.StartBroker(ctx, leader); err != nil {
		t.Fatal(err)
	}
	if err := c.StartBroker(ctx, leader); err == nil {
		t.Fatal("StartBroker on a running broker: want an error")
	}
}

func TestStartRejectsOwnedProps(t *testing.T) {
	_, err := harness.Start(context.Background(), harness.Options{BrokerProps: map[string]string{"listeners": "x"}})
	if err == nil || !strings.Contains(err.Error(), `"listeners"`) {
		t.Fatalf("Start with BrokerProps[listeners]: err = %v, want one naming the key", err)
	}
}

// client returns a kafka-go client with its own transport, so that no
// metadata cached before a restart or kill is reused.
func client(addrs []string) (*kafka.Client, func()) {
	tr := &kafka.Transport{ClientID: "harness-test", DialTimeout: 2 * time.Second}
	return &kafka.Client{Addr: kafka.TCP(addrs...), Transport: tr, Timeout: 5 * time.Second}, tr.CloseIdleConnections
}

// eventually retries f until it succeeds or ctx ends: leadership moves
// asynchronously after restarts and kills.
func eventually(ctx context.Context, t *testing.T, what string, f func(context.Context) error) {
	t.Helper()
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := f(attempt)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v (gave up: %v)", what, err, ctx.Err())
		case <-ticker.C:
		}
	}
}

// produce writes values with acks=all and returns the first one's offset.
func produce(ctx context.Context, t *testing.T, addrs []string, topic string, partition int, values ...string) int64 {
	t.Helper()
	records := make([]kafka.Record, len(values))
	for i, v := range values {
		records[i] = kafka.Record{Value: kafka.NewBytes([]byte(v))}
	}
	var base int64
	eventually(ctx, t, "produce to "+topic, func(ctx context.Context) error {
		cl, done := client(addrs)
		defer done()
		res, err := cl.Produce(ctx, &kafka.ProduceRequest{
			Topic:        topic,
			Partition:    partition,
			RequiredAcks: kafka.RequireAll,
			Records:      kafka.NewRecordReader(records...),
		})
		if err != nil {
			return err
		}
		if res.Error != nil {
			return res.Error
		}
		base = res.BaseOffset
		return nil
	})
	return base
}

// assertRecord fetches the record at offset and compares its value.
func assertRecord(ctx context.Context, t *testing.T, addrs []string, topic string, partition int, offset int64, want string) {
	t.Helper()
	eventually(ctx, t, fmt.Sprintf("fetch %s/%d@%d", topic, partition, offset), func(ctx context.Context) error {
		cl, done := client(addrs)
		defer done()
		res, err := cl.Fetch(ctx, &kafka.FetchRequest{
			Topic: topic, Partition: partition, Offset: offset,
			MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 500 * time.Millisecond,
		})
		if err != nil {
			return err
		}
		if res.Error != nil {
			return res.Error
		}
		for {
			r, err := res.Records.ReadRecord()
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("no record at offset %d (high watermark %d)", offset, res.HighWatermark)
			}
			if err != nil {
				return err
			}
			if r.Offset != offset {
				continue
			}
			got, err := io.ReadAll(r.Value)
			if err != nil {
				return err
			}
			if string(got) != want {
				t.Fatalf("record %s/%d@%d = %q, want %q", topic, partition, offset, got, want)
			}
			return nil
		}
	})
}

// leaderIndex returns the broker index leading partition 0 of topic.
func leaderIndex(ctx context.Context, t *testing.T, addrs []string, topic string) int {
	t.Helper()
	cl, done := client(addrs)
	defer done()
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	leader := md.Topics[0].Partitions[0].Leader
	for i, a := range addrs {
		if a == leader.Host+":"+strconv.Itoa(leader.Port) {
			return i
		}
	}
	t.Fatalf("leader %+v of %s is none of %v", leader, topic, addrs)
	return -1
}

// childJVMs lists java processes whose parent is this test binary.
func childJVMs() []string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var leaked []string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// Fields after the ")" that closes the command name: state, ppid, ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) || !strings.Contains(s[:i], "java") {
			continue
		}
		leaked = append(leaked, strings.TrimSuffix(filepath.Base(filepath.Dir(path)), "/"))
	}
	return leaked
}
