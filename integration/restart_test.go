package integration

import (
	"context"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestBrokerRestarts restarts the source broker (graceful) and then kills
// and restarts the destination broker (SIGKILL) while a stream is being
// mirrored: no loss, no duplicate.
func TestBrokerRestarts(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "restarts", 6
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	wait := streamRecords(t, topic, 150_000, 10_000)

	<-time.After(3 * time.Second)
	if err := env.src.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	<-time.After(time.Second)
	if err := env.src.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	t.Log("restarted the source broker")

	<-time.After(3 * time.Second)
	if err := env.dst.KillBroker(0); err != nil {
		t.Fatal(err)
	}
	<-time.After(time.Second)
	if err := env.dst.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	t.Log("killed and restarted the destination broker")

	wait()
	waitCaughtUp(t, m, "src", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
}
