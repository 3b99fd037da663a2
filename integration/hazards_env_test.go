package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// Helpers of the hazard tests: admin requests against the real clusters
// (topics, partitions, configs, records, unclean elections) and waits.

// adminRequest sends one admin request through a franz-go client and fails
// the test on a transport error; error codes are the caller's to check.
func adminRequest(t *testing.T, cl *harness.Cluster, req kmsg.Request) kmsg.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := kgoClient(t, cl).Request(ctx, req)
	if err != nil {
		t.Fatalf("%T: %v", req, err)
	}
	return res
}

func createPartitions(t *testing.T, cl *harness.Cluster, topic string, count int32) {
	t.Helper()
	req := kmsg.NewPtrCreatePartitionsRequest()
	rt := kmsg.NewCreatePartitionsRequestTopic()
	rt.Topic, rt.Count = topic, count
	req.Topics, req.TimeoutMillis = append(req.Topics, rt), 30000
	for _, r := range adminRequest(t, cl, req).(*kmsg.CreatePartitionsResponse).Topics {
		if r.ErrorCode != 0 {
			t.Fatalf("create partitions of %s: error %d", topic, r.ErrorCode)
		}
	}
}

func deleteTopic(t *testing.T, cl *harness.Cluster, topic string) {
	t.Helper()
	req := kmsg.NewPtrDeleteTopicsRequest()
	rt := kmsg.NewDeleteTopicsRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics, req.TopicNames, req.TimeoutMillis = append(req.Topics, rt), []string{topic}, 30000
	for _, r := range adminRequest(t, cl, req).(*kmsg.DeleteTopicsResponse).Topics {
		if r.ErrorCode != 0 {
			t.Fatalf("delete topic %s: error %d", topic, r.ErrorCode)
		}
	}
}

// recreateTopic creates a topic just deleted, retrying while the broker
// still finishes the deletion.
func recreateTopic(t *testing.T, cl *harness.Cluster, topic string, partitions int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cl.CreateTopic(context.Background(), topic, partitions, 1, nil)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("recreate %s: %v", topic, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// deleteRecords moves a partition's log start offset to offset.
func deleteRecords(t *testing.T, cl *harness.Cluster, topic string, partition int32, offset int64) {
	t.Helper()
	req := kmsg.NewPtrDeleteRecordsRequest()
	rt := kmsg.NewDeleteRecordsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewDeleteRecordsRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics, req.TimeoutMillis = append(req.Topics, rt), 30000
	for _, r := range adminRequest(t, cl, req).(*kmsg.DeleteRecordsResponse).Topics {
		for _, p := range r.Partitions {
			if p.ErrorCode != 0 || p.LowWatermark != offset {
				t.Fatalf("delete records of %s/%d below %d: error %d, log start %d", topic, partition, offset, p.ErrorCode, p.LowWatermark)
			}
		}
	}
}

// alterBrokerDefault sets (value != "") or deletes a cluster-wide dynamic
// broker config.
func alterBrokerDefault(t *testing.T, cl *harness.Cluster, name, value string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeBroker
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = name
	if value == "" {
		c.Op = kmsg.IncrementalAlterConfigOpDelete
	} else {
		c.Value = kmsg.StringPtr(value)
	}
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	for _, r := range adminRequest(t, cl, req).(*kmsg.IncrementalAlterConfigsResponse).Resources {
		if r.ErrorCode != 0 {
			t.Fatalf("alter broker default %s=%q: error %d %v", name, value, r.ErrorCode, r.ErrorMessage)
		}
	}
}

// topicConfig returns a topic's effective value of one config.
func topicConfig(t *testing.T, cl *harness.Cluster, topic, name string) string {
	t.Helper()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName, res.ConfigNames = kmsg.ConfigResourceTypeTopic, topic, []string{name}
	req.Resources = append(req.Resources, res)
	for _, r := range adminRequest(t, cl, req).(*kmsg.DescribeConfigsResponse).Resources {
		for _, c := range r.Configs {
			if c.Name == name && c.Value != nil {
				return *c.Value
			}
		}
	}
	t.Fatalf("topic %s has no config %s", topic, name)
	return ""
}

func keyedRecords(topic string, from, n int) []*kgo.Record {
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("key-%d", from+i)), Value: []byte(fmt.Sprintf("value-%d", from+i)),
			Headers: []kgo.RecordHeader{{Key: "n", Value: []byte(fmt.Sprint(from + i))}}}
	}
	return recs
}

// waitPartitions waits until describe lists n partitions of topic.
func waitPartitions(t *testing.T, m *member, mirror, topic string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has %d partitions in describe after a minute, want %d: %+v", topic, len(rows), n, rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitAllStates waits until every partition of topic is in state with a
// reason containing want, and returns the rows.
func waitAllStates(t *testing.T, m *member, mirror, topic, state, want string, within time.Duration) []api.PartitionStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	var rows []api.PartitionStatus
	for {
		var err error
		rows, err = m.client.Describe(context.Background(), mirror, topic)
		if err != nil {
			t.Fatal(err)
		}
		ok := len(rows) > 0
		for _, r := range rows {
			if r.State != state || !strings.Contains(r.Reason, want) {
				ok = false
			}
		}
		if ok {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not every partition %s with %q after %s: %+v\n%s", topic, state, want, within, rows, m.logTail())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// alterTopicConfig sets one config of a topic.
func alterTopicConfig(t *testing.T, cl *harness.Cluster, topic, name, value string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = name, kmsg.StringPtr(value)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	for _, r := range adminRequest(t, cl, req).(*kmsg.IncrementalAlterConfigsResponse).Resources {
		if r.ErrorCode != 0 {
			t.Fatalf("alter %s %s=%s: error %d %v", topic, name, value, r.ErrorCode, r.ErrorMessage)
		}
	}
}

// startMirrorMember starts a member of its own for one test, with mirror
// pointing at the source cluster src; src is where its waits compare with.
func startMirrorMember(t *testing.T, name string, o memberOpts, mirror string, src *harness.Cluster) *member {
	t.Helper()
	m := startMember(t, name, o)
	if src != env.src {
		m.src = src
	}
	if err := m.client.CreateMirror(context.Background(), api.CreateMirrorRequest{
		Name: mirror, Properties: map[string]string{"bootstrap.servers": src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}
	return m
}

// addCaughtUp adds topic to mirror and waits until it is mirrored with
// lag 0.
func addCaughtUp(t *testing.T, m *member, mirror, topic string) []api.PartitionStatus {
	t.Helper()
	if _, err := m.client.AddTopics(context.Background(), api.AddTopicsRequest{Mirror: mirror, Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	return waitCaughtUp(t, m, mirror, topic)
}

// partitionLeader returns the node ID leading partition 0 of topic (-1:
// none).
func partitionLeader(t *testing.T, cl *harness.Cluster, topic string) int32 {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	for _, mt := range adminRequest(t, cl, req).(*kmsg.MetadataResponse).Topics {
		for _, p := range mt.Partitions {
			if p.Partition == 0 && p.ErrorCode == 0 {
				return p.Leader
			}
		}
	}
	return -1
}

// startUncleanCluster starts a 2-broker cluster that allows unclean
// leader elections, with fast failure detection.
func startUncleanCluster(t *testing.T, name string) *harness.Cluster {
	t.Helper()
	cl, err := harness.Start(context.Background(), harness.Options{Name: name, Brokers: 2, BrokerProps: map[string]string{
		"unclean.leader.election.enable": "true",
		"replica.lag.time.max.ms":        "3000",
		"broker.session.timeout.ms":      "3000",
		"broker.heartbeat.interval.ms":   "500",
		"default.replication.factor":     "2",
		"min.insync.replicas":            "1",
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// electUnclean makes node the leader of partition 0 of topic by an
// unclean election (ElectLeaders UNCLEAN), retried until the old leader
// is fenced, for at most 90 s.
func electUnclean(t *testing.T, cl *harness.Cluster, topic string, node int32) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for partitionLeader(t, cl, topic) != node {
		req := kmsg.NewPtrElectLeadersRequest()
		req.ElectionType, req.TimeoutMillis = 1, 10000 // UNCLEAN
		rt := kmsg.NewElectLeadersRequestTopic()
		rt.Topic, rt.Partitions = topic, []int32{0}
		req.Topics = append(req.Topics, rt)
		adminRequest(t, cl, req) // refused until the old leader is fenced: retried
		if time.Now().After(deadline) {
			t.Fatalf("the out-of-sync follower never became leader of %s", topic)
		}
		time.Sleep(time.Second)
	}
}
