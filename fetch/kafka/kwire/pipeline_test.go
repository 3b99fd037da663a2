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

// TestPipelinedProduceAnswersInOrder: five produce requests written to one
// connection before any answer is read come back in the order sent, each
// with its own answer (correlation ID), the batches appended in that order.
func TestPipelinedProduceAnswersInOrder(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := Dial(context.Background(), c.ListenAddrs()[0], "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var pending []PendingProduce
	for i := range 5 {
		recs := make([]Record, i+1) // batch i holds i+1 records
		for j := range recs {
			recs[j] = Record{Timestamp: 1700000000000, Value: []byte{byte(i), byte(j)}}
		}
		b, err := EncodeBatch(recs, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := conn.SendProduce(ctx, -1, time.Second, time.Time{}, []ProducePartition{{Topic: "t", Partition: 0, Batch: b}})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		pending = append(pending, p)
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
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := Dial(context.Background(), c.ListenAddrs()[0], "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := EncodeBatch([]Record{{Timestamp: 1700000000000, Value: []byte("v")}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.SendProduce(ctx, -1, time.Second, time.Time{}, []ProducePartition{{Topic: "t", Partition: 0, Batch: b}}); err != nil {
		t.Fatal(err)
	}
	second, err := conn.SendProduce(ctx, -1, time.Second, time.Time{}, []ProducePartition{{Topic: "t", Partition: 0, Batch: b}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.ReceiveProduce(ctx, second)
	if err == nil || !strings.Contains(err.Error(), "correlation ID") {
		t.Fatalf("the second request's answer read first: %v, want a correlation ID mismatch", err)
	}
}

// TestPipelinedAnswersOverAStalledLinkFailWithinBound: with requests
// pending on a link that stalls, each ReceiveProduce fails with
// os.ErrDeadlineExceeded within the broker's bound plus AnswerSlack, also
// with no context deadline (issue 18's bound, for a pipelined connection).
func TestPipelinedAnswersOverAStalledLinkFailWithinBound(t *testing.T) {
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
	conn, err := Dial(context.Background(), px.Addr(), "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
