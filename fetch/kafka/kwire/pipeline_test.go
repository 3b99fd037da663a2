package kwire

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kmirror/kmirror/integration/harness"
)

// kfakeBroker starts a one-broker kfake cluster with topic t and returns
// its address.
func kfakeBroker(t *testing.T) string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()[0]
}

// dialTest connects to addr, closed when the test ends.
func dialTest(t *testing.T, addr string) *Conn {
	t.Helper()
	conn, err := Dial(context.Background(), addr, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// sendBatch sends a produce of a batch of n records to t/0.
func sendBatch(t *testing.T, ctx context.Context, conn *Conn, n int) PendingProduce {
	t.Helper()
	recs := make([]Record, n)
	for j := range recs {
		recs[j] = Record{Timestamp: 1700000000000, Value: []byte{byte(n), byte(j)}}
	}
	b, err := EncodeBatch(recs, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := conn.SendProduce(ctx, -1, time.Second, time.Time{}, []ProducePartition{{Topic: "t", Partition: 0, Batch: b}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPipelinedProduceAnswersInOrder: five produce requests written to one
// connection before any answer is read come back in the order sent, each
// with its own answer (correlation ID), the batches appended in that order.
func TestPipelinedProduceAnswersInOrder(t *testing.T) {
	conn := dialTest(t, kfakeBroker(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pending []PendingProduce
	for i := range 5 {
		pending = append(pending, sendBatch(t, ctx, conn, i+1)) // batch i holds i+1 records
	}
	next := int64(0)
	for i, p := range pending {
		res, err := conn.ReceiveProduce(ctx, p)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if len(res) != 1 || res[0].Err != 0 || res[0].BaseOffset != next {
			t.Fatalf("answer %d: %+v, want base offset %d", i, res, next)
		}
		next += int64(i + 1)
	}
}

// TestPipelinedProduceNamesAnAnswerOutOfTurn: reading the answer of a
// later request first fails on the correlation ID instead of taking the
// earlier request's answer for it.
func TestPipelinedProduceNamesAnAnswerOutOfTurn(t *testing.T) {
	conn := dialTest(t, kfakeBroker(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sendBatch(t, ctx, conn, 1)
	second := sendBatch(t, ctx, conn, 1)
	_, err := conn.ReceiveProduce(ctx, second)
	if err == nil || !strings.Contains(err.Error(), "correlation ID") {
		t.Fatalf("the second request's answer read first: %v, want a correlation ID mismatch", err)
	}
}

// TestPipelinedAnswersOverAStalledLinkFailWithinBound: with requests
// pending on a link that stalls, each ReceiveProduce fails with
// os.ErrDeadlineExceeded within the broker's bound plus AnswerSlack, also
// with no context deadline (issue 18's bound, for a pipelined connection).
func TestPipelinedAnswersOverAStalledLinkFailWithinBound(t *testing.T) {
	px, err := harness.NewProxy(kfakeBroker(t))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	conn := dialTest(t, px.Addr())
	px.Stall(true)
	const bound = 200 * time.Millisecond
	var pending []PendingProduce
	for range 3 {
		p, err := conn.SendProduce(context.Background(), -1, bound, time.Time{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		pending = append(pending, p)
	}
	done := make(chan error, 1)
	go func() { _, err := conn.ReceiveProduce(context.Background(), pending[0]); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a pipelined produce over a stalled link: %v, want a deadline error", err)
		}
	case <-time.After(10 * (bound + AnswerSlack)):
		t.Fatalf("a pipelined produce over a stalled link still waits after %v", 10*(bound+AnswerSlack))
	}
}
