package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestUnverifiedStopSettledWhenSourceReturns: the source cluster and one
// member (kill -9) go at once, and the topic is failed over. The dead
// member's partitions hold records past their last checkpoint
// (checkpoint_interval 1h) that nobody can verify without the source: the
// members that take them over record the last verified position at once
// (their probe finds the source gone, so no 30 s of retries), and name
// the records left out. Once the source is back, the leader verifies
// those records and records, in raft and in __kmirror_state, the
// position they reach: the source's and the destination's end (issue 18:
// unverified positions were never settled, and a later failback would
// take kmirror's own copies for divergent records).
func TestUnverifiedStopSettledWhenSourceReturns(t *testing.T) {
	ctx := context.Background()
	src, err := harness.Start(ctx, harness.Options{Name: "us-source", BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	g := startGroupWith(t, "us", 3, memberOpts{checkpoint: "1h"})
	victim, m := g.followerAndWatcher()
	m.src = src
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "us", Properties: map[string]string{"bootstrap.servers": src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "us-topic", 6
	if err := src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamRecordsTo(t, src, topic, 3000, 100_000)()
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "us", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		rows := waitCaughtUp(t, m, "us", topic)
		owned := 0
		for _, r := range rows {
			if r.Owner == memberID(victim) {
				owned++
			}
		}
		if owned > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%s owns none of the partitions after a minute: %+v", memberID(victim), rows)
		}
	}
	// More records after the last handoff's checkpoint, so that the
	// victim's partitions hold records past theirs.
	streamRecordsTo(t, src, topic, 600, 100_000)()
	waitCaughtUp(t, m, "us", topic)
	srcEnd := endOffsets(t, kgoClient(t, src), topic, partitions, true)
	dstEnd := endOffsets(t, kgoClient(t, env.dst), topic, partitions, false)

	victim.kill9()
	if err := src.StopBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if out, errOut, code := cli(t, m, "remove", "--mirror", "us", "--topic", topic); code != 0 {
		t.Fatalf("remove with the source and a member gone: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("remove with the source and a member gone took %s (lease_ttl 6s)", time.Since(start).Round(100*time.Millisecond))
	rows, err := m.client.Describe(ctx, "us", topic)
	if err != nil {
		t.Fatal(err)
	}
	unverified := 0
	for _, r := range rows {
		if r.State != "STOPPED" {
			t.Fatalf("after remove: %+v, want every partition STOPPED", rows)
		}
		if strings.Contains(r.Reason, "could not be verified against the source") {
			unverified++
			if r.DestinationOffset >= dstEnd[r.Partition] {
				t.Fatalf("partition %d named unverified records but recorded the destination's end: %+v", r.Partition, r)
			}
		}
	}
	if unverified == 0 {
		t.Fatalf("no partition was stopped with unverified records: the test did not exercise the settling: %+v", rows)
	}

	if err := src.StartBroker(ctx, 0); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		rows, err := m.client.Describe(ctx, "us", topic)
		if err != nil {
			t.Fatal(err)
		}
		settled := true
		for _, r := range rows {
			if r.SourceOffset != srcEnd[r.Partition] || r.DestinationOffset != dstEnd[r.Partition] || strings.Contains(r.Reason, "verified") {
				settled = false
			}
		}
		if settled {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("not settled 2 minutes after the source came back: %+v; want source %v, destination %v", rows, srcEnd, dstEnd)
		}
	}
	requireStoppedAt(t, m, "us", topic, srcEnd, dstEnd)
}
