package harness_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

// TestOlderKafkaVersions (issue 21): the harness starts released Kafka
// versions other than the default, from Maven Central's jars, in
// ZooKeeper mode (before 4.0) and in KRaft mode (3.3 on): each cluster
// takes a topic, a record written and read back, survives a broker
// restart, and reports the cluster ID its brokers answer with.
func TestOlderKafkaVersions(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		version string
		zk      bool
	}{
		{"2.8.2", true},
		{"3.9.1", true},
		{"3.9.1", false},
	} {
		mode := "KRaft"
		if tc.zk {
			mode = "ZooKeeper"
		}
		t.Run(tc.version+"-"+mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			start := time.Now()
			c, err := harness.Start(ctx, harness.Options{Name: "v" + strings.ReplaceAll(tc.version, ".", ""), KafkaVersion: tc.version, ZooKeeper: tc.zk})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			t.Logf("Kafka %s (%s) ready in %v, cluster %s", tc.version, mode, time.Since(start).Round(time.Millisecond), c.ClusterID())
			if c.ClusterID() == "" {
				t.Fatal("no cluster ID")
			}
			if err := c.CreateTopic(ctx, "old", 1, 1, map[string]string{"cleanup.policy": "delete"}); err != nil {
				t.Fatal(err)
			}
			offset := produce(ctx, t, c.BrokerAddrs(), "old", 0, "on "+tc.version)
			assertRecord(ctx, t, c.BrokerAddrs(), "old", 0, offset, "on "+tc.version)
			if err := c.StopBroker(ctx, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.StartBroker(ctx, 0); err != nil {
				t.Fatal(err)
			}
			assertRecord(ctx, t, c.BrokerAddrs(), "old", 0, offset, "on "+tc.version)
		})
	}
}

// TestModeRefusals: a metadata mode the version lacks is refused before
// anything starts, naming the option.
func TestModeRefusals(t *testing.T) {
	for _, o := range []harness.Options{
		{KafkaVersion: "4.1.1", ZooKeeper: true},
		{KafkaVersion: "2.8.2"},
		{KafkaVersion: "3.9.1", ZooKeeper: true, FormatArgs: []string{"--add-scram", "x"}},
		{KafkaVersion: "four"},
	} {
		if _, err := harness.Start(context.Background(), o); err == nil || !strings.Contains(err.Error(), "harness: ") {
			t.Errorf("%+v: %v, want a harness error", o, err)
		} else {
			t.Logf("%s %v: %v", o.KafkaVersion, o.ZooKeeper, err)
		}
	}
}
