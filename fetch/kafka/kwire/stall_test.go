package kwire

import (
	"context"
	"errors"
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
