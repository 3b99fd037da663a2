package integration

import (
	"context"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
)

// TestTopicConfigSyncFollowsSource (issue 21): with
// topics.config.sync.interval 1 s, a retention change on the source topic
// reaches the mirror topic within a few intervals; a config named in
// topics.config.exclude keeps the destination's value.
func TestTopicConfigSyncFollowsSource(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const mirror, topic = "cfgsync", "cfg-sync"
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "topics.config.sync.interval": "1000", "topics.config.exclude": "segment.ms"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.client.DeleteMirror(context.Background(), mirror, true); err != nil {
			t.Errorf("delete mirror %s: %v", mirror, err)
		}
	})
	if err := env.src.CreateTopic(ctx, topic, 1, 1, map[string]string{"retention.ms": "86400000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: mirror, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	src := kafka.NewAdmin("source", []string{env.src.Bootstrap()}, "test", nil)
	defer src.Close()
	dst := kafka.NewAdmin("destination", []string{env.dst.Bootstrap()}, "test", nil)
	defer dst.Close()
	before, err := dst.TopicConfigs(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if err := src.AlterTopicConfigs(ctx, topic, map[string]string{"retention.ms": "3600000", "segment.ms": "7200000"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := dst.TopicConfigs(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		if got["retention.ms"] == "3600000" {
			if got["segment.ms"] != before["segment.ms"] {
				t.Fatalf("excluded segment.ms changed on the destination: %s, was %s", got["segment.ms"], before["segment.ms"])
			}
			t.Logf("retention.ms reached the mirror topic %v after the source's change (interval 1s)", time.Since(changed).Round(time.Millisecond))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("destination retention.ms still %s 30 s after the source's change; describe: %v", got["retention.ms"], describeRows(t, m, mirror, topic))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// describeRows is describe's rows of topic, for failure messages.
func describeRows(t *testing.T, m *member, mirror, topic string) []api.PartitionStatus {
	rows, err := m.client.Describe(context.Background(), mirror, topic)
	if err != nil {
		t.Logf("describe: %v", err)
	}
	return rows
}
