package kwire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kmirror/kmirror/integration/harness"
)

// TestStalledLinkAnswersFailWithinBound: with a link that stalls (bytes
// held, no RST, no FIN), a produce and a fetch sent with no context
// deadline fail with os.ErrDeadlineExceeded by the broker's own bound plus
// AnswerSlack, not after the connection's two-minute default (issue 18: a
// held produce waited 12 s, a stalled fetch 30 s). The guard below is ten
// times the bound, so it only catches a hang.
func TestStalledLinkAnswersFailWithinBound(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	px, err := harness.NewProxy(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	dial := func() *Conn {
		conn, err := Dial(context.Background(), px.Addr(), "test", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	pconn, fconn := dial(), dial()
	px.Stall(true)
	const bound = 200 * time.Millisecond
	calls := map[string]func() error{
		"produce": func() error {
			_, err := pconn.Produce(context.Background(), -1, bound, time.Time{}, nil)
			return err
		},
		"fetch": func() error {
			_, err := fconn.FetchSession(context.Background(), &FetchRequest{MaxWait: bound, MaxBytes: 1 << 20, SessionEpoch: -1})
			return err
		},
	}
	for _, name := range []string{"produce", "fetch"} {
		done := make(chan error, 1)
		go func() { done <- calls[name]() }()
		select {
		case err := <-done:
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("%s over a stalled link: %v, want a deadline error", name, err)
			}
		case <-time.After(10 * (bound + AnswerSlack)):
			t.Fatalf("%s over a stalled link still waits after %v", name, 10*(bound+AnswerSlack))
		}
	}
}

// TestSlowAnswerIsNotCutOff: an answer that keeps coming, however slowly,
// is read to its end even when it takes longer than timeout + AnswerSlack
// in all (a large fetch over a thin link); only a gap over AnswerSlack is
// a stall. The broker's side is a pipe that answers a produce with an
// empty response, one byte every AnswerSlack/4.
func TestSlowAnswerIsNotCutOff(t *testing.T) {
	client, broker := net.Pipe()
	defer client.Close()
	defer broker.Close()
	conn := &Conn{addr: "pipe", nc: client, br: bufio.NewReader(client), clientID: "test"}
	go func() {
		var size [4]byte
		if _, err := io.ReadFull(broker, size[:]); err != nil {
			return
		}
		req := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(broker, req); err != nil {
			return
		}
		// size, correlation ID, no topics, no throttle.
		answer := binary.BigEndian.AppendUint32(nil, 12)
		answer = append(answer, req[4:8]...)
		answer = append(answer, 0, 0, 0, 0, 0, 0, 0, 0)
		for _, b := range answer {
			time.Sleep(AnswerSlack / 4)
			if _, err := broker.Write([]byte{b}); err != nil {
				return
			}
		}
	}()
	const timeout = 100 * time.Millisecond
	start := time.Now()
	res, err := conn.Produce(context.Background(), -1, timeout, time.Time{}, nil)
	if err != nil {
		t.Fatalf("a slow answer (one byte every %v) was cut off after %v: %v", AnswerSlack/4, time.Since(start), err)
	}
	if len(res) != 0 {
		t.Fatalf("empty produce answer parsed as %v", res)
	}
	t.Logf("answer of 16 bytes read over %v (timeout + AnswerSlack = %v)", time.Since(start), timeout+AnswerSlack)
}

// TestProduceNotWrittenAfterWriteBy: a produce request is written only
// before writeBy (the end of the member's lease, fetch/DESIGN.md): one
// whose writeBy has passed sends no byte, and one the peer does not take
// by writeBy fails then, not at its context's deadline; both fail with
// ErrNotSent (issue 19: the sender's own lease check is not the only
// gate).
func TestProduceNotWrittenAfterWriteBy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		writeBy time.Duration // from now
	}{{"lease already over", -time.Millisecond}, {"lease ends while writing", 200 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			client, broker := net.Pipe() // a write completes only as the peer reads
			defer client.Close()
			defer broker.Close()
			conn := &Conn{addr: "pipe", nc: client, br: bufio.NewReader(client), clientID: "test"}
			if tc.writeBy < 0 {
				// The broker reads all it is sent: nothing must come.
				got := make(chan int, 1)
				go func() {
					n, _ := io.Copy(io.Discard, broker)
					got <- int(n)
				}()
				defer func() {
					client.Close()
					if n := <-got; n != 0 {
						t.Errorf("the broker received %d bytes of a request whose writeBy had passed", n)
					}
				}()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			_, err := conn.Produce(ctx, -1, time.Second, start.Add(tc.writeBy),
				[]ProducePartition{{Topic: "t", Partition: 0, Batch: make([]byte, 64)}})
			if !errors.Is(err, ErrNotSent) {
				t.Fatalf("produce with writeBy %v from now: %v, want ErrNotSent", tc.writeBy, err)
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("the write waited for its context's deadline, not writeBy")
			}
		})
	}
}
