package integration

import (
	"context"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestDestinationLeaderChanges mirrors into a 3-broker destination with
// replication factor 3 and kills destination brokers (partition leaders
// among them) one after another while a stream is mirrored: produce
// requests in flight when a leader dies have an unknown outcome: kmirror
// reads what the new leader holds (waiting for records above its high
// watermark to be committed or truncated) before it resends. No loss, no
// duplicate, also for records two days old whose producer state the
// brokers drop.
func TestDestinationLeaderChanges(t *testing.T) {
	ctx := context.Background()
	dst3 := startThreeBrokers(t, "destination3")
	m := startMember(t, "leaders", memberOpts{destination: dst3.Bootstrap(), destExtra: "  replication_factor: 3\n"})
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "lsrc", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	// One stream with fresh timestamps, one two days old: for the second
	// the destination drops the producer state, so a batch appended above
	// the high watermark when its leader died cannot be de-duplicated.
	const topic, oldTopic, partitions = "leader-moves", "leader-moves-old", 6
	for _, tp := range []string{topic, oldTopic} {
		if err := env.src.CreateTopic(ctx, tp, partitions, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "lsrc", Topics: []string{topic, oldTopic}}); err != nil {
		t.Fatal(err)
	}
	// The streams run until the kills below are done. Whether a kill
	// catches a produce to the old topic in flight is luck, so the brokers
	// are killed in turn until one did (each at least once, at most
	// maxKills kills); requireConfirms below fails if none did.
	const maxKills = 15
	stop := make(chan struct{})
	wait := streamAgedUntil(t, env.src, topic, maxKills*6*6_000, 6_000, 0, stop)
	waitOld := streamAgedUntil(t, env.src, oldTopic, maxKills*6*6_000, 6_000, backlogAge, stop)
	for i := 0; i < maxKills; i++ {
		if confirms, _ := countConfirms(t, m, oldTopic); i >= 3 && confirms > 0 {
			break
		}
		<-time.After(3 * time.Second)
		if err := dst3.KillBroker(i % 3); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed destination broker %d", i%3)
		<-time.After(3 * time.Second)
		if err := dst3.StartBroker(ctx, i%3); err != nil {
			t.Fatal(err)
		}
	}
	<-time.After(3 * time.Second)
	close(stop)
	wait()
	waitOld()
	requireNoDuplicates(t, waitCaughtUp(t, m, "lsrc", topic, oldTopic))
	for _, tp := range []string{topic, oldTopic} {
		requireSameRecords(t, readAll(t, env.src, tp, partitions, true), readAll(t, dst3, tp, partitions, true))
	}
	requireConfirms(t, m, oldTopic)
}

// startThreeBrokers starts a 3-broker cluster (plus its controller) with
// replication factor 3, min.insync.replicas 2 and fast failure detection.
func startThreeBrokers(t *testing.T, name string) *harness.Cluster {
	t.Helper()
	cl, err := harness.Start(context.Background(), harness.Options{Name: name, Brokers: 3, BrokerProps: map[string]string{
		"replica.lag.time.max.ms":      "3000",
		"broker.session.timeout.ms":    "3000",
		"broker.heartbeat.interval.ms": "500",
		"default.replication.factor":   "3",
		"min.insync.replicas":          "2",
		// See brokerProps.
		"producer.id.expiration.check.interval.ms": "1000",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestSourceLeaderChanges mirrors from a 3-broker source with replication
// factor 3 and kills each source broker in turn while a stream is
// produced and mirrored: fetches fail over to the new leaders (fresh
// metadata, leader epochs), with no loss and no duplicate.
func TestSourceLeaderChanges(t *testing.T) {
	ctx := context.Background()
	src3 := startThreeBrokers(t, "source3")
	m := startMember(t, "sleaders", memberOpts{})
	m.src = src3
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "s3", Properties: map[string]string{"bootstrap.servers": src3.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "source-leader-moves", 6
	if err := src3.CreateTopic(ctx, topic, partitions, 3, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "s3", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	wait := streamRecordsTo(t, src3, topic, 100_000, 6_000)
	for i := 0; i < 3; i++ {
		<-time.After(3 * time.Second)
		if err := src3.KillBroker(i); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed source broker %d", i)
		<-time.After(3 * time.Second)
		if err := src3.StartBroker(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	wait()
	waitCaughtUp(t, m, "s3", topic)
	requireSameRecords(t, readAll(t, src3, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
}
