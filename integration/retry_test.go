package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestRetriableErrorIsShown: while the destination cannot take writes (its
// broker is down) the partition stays MIRRORING and describe says what it
// is retrying; once the destination is back, mirroring continues with no
// loss and no duplicate, and the reason is gone.
func TestRetriableErrorIsShown(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic = "retrying"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	streamRecords(t, topic, 500, 100_000)()
	waitCaughtUp(t, m, "src", topic)

	if err := env.dst.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			env.dst.StartBroker(ctx, 0)
		}
	}()
	streamRecords(t, topic, 500, 100_000)()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := m.client.Describe(ctx, "src", topic)
		if err != nil {
			t.Fatal(err)
		}
		r := rows[0]
		if r.State == "MIRRORING" && strings.HasPrefix(r.Reason, "retrying: ") && strings.Contains(r.Reason, "produce to") {
			t.Logf("describe shows: %s", r.Reason)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("describe never showed the retried error: %+v", r)
		}
		<-time.After(100 * time.Millisecond)
	}

	if err := env.dst.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	restarted = true
	rows := waitCaughtUp(t, m, "src", topic)
	// A checkpoint that failed while the broker was down is written again
	// within a checkpoint interval or two; then no reason is left.
	deadline = time.Now().Add(10 * time.Second)
	for rows[0].Reason != "" {
		if time.Now().After(deadline) {
			t.Fatalf("reason %q left after recovery", rows[0].Reason)
		}
		time.Sleep(200 * time.Millisecond)
		var err error
		if rows, err = m.client.Describe(ctx, "src", topic); err != nil {
			t.Fatal(err)
		}
	}
	requireSameRecords(t, readAll(t, env.src, topic, 1, true), readAll(t, env.dst, topic, 1, true))
}
