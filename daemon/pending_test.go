package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// TestPendingTopicFinishedWithItsConfigs: a topic left PENDING (the leader
// crashed between recording it and creating the destination topic) is
// created by the next leader with the configs and replication factor the
// record carries, not the bare defaults; a creation the destination
// refuses stays PENDING with the broker's reason and is retried, and
// remove of a PENDING topic settles at once.
func TestPendingTopicFinishedWithItsConfigs(t *testing.T) {
	dst, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	g := newGroup(t, 1, time.Second)
	l := g.leader()
	l.dest = kafka.NewAdmin("destination cluster", dst.ListenAddrs(), "test", nil)
	t.Cleanup(l.dest.Close)
	l.wireOps() // the operator verbs on this destination
	ctx := context.Background()
	if err := l.store.Apply(ctx, raftstore.CreateMirror{Mirror: raftstore.Mirror{Name: "m", Bootstrap: []string{"src:9092"}}}); err != nil {
		t.Fatal(err)
	}
	add := func(topic string, configs map[string]string, rf int16) {
		t.Helper()
		if err := l.store.Apply(ctx, raftstore.AddTopic{Topic: raftstore.MirrorTopic{Mirror: "m", Topic: topic, State: raftstore.StatePending,
			DestinationConfigs: configs, ReplicationFactor: rf,
			Partitions: []raftstore.PartitionInfo{{State: raftstore.StatePending}, {State: raftstore.StatePending}}}}); err != nil {
			t.Fatal(err)
		}
	}
	topicOf := func(topic string) (mt raftstore.MirrorTopic) {
		l.store.Read(func(s *raftstore.State) {
			if p, ok := s.Topic("m", topic); ok {
				mt = *p.Clone()
			}
		})
		return mt
	}
	add("good", map[string]string{"retention.ms": "12345", "cleanup.policy": "delete"}, 1)
	waitFor(t, 20*time.Second, "the pending topic to be finished", func() bool { return topicOf("good").State == raftstore.StateMirroring })
	if topicOf("good").DestTopicID == "" {
		t.Fatal("the destination topic ID was not recorded")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(dst.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType, res.ResourceName, res.ConfigNames = kmsg.ConfigResourceTypeTopic, "good", []string{"retention.ms"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Resources) != 1 || len(resp.Resources[0].Configs) != 1 || *resp.Resources[0].Configs[0].Value != "12345" {
		t.Fatalf("destination topic's retention.ms: %+v, %v; want the recorded 12345", resp, err)
	}

	add("refused", map[string]string{"retention.ms": "12345"}, 3) // one broker
	waitFor(t, 20*time.Second, "the refusal to show", func() bool {
		return strings.Contains(topicOf("refused").Reason, "creating the destination topic failed")
	})
	if st := topicOf("refused").State; st != raftstore.StatePending {
		t.Fatalf("a refused creation left the topic %s, want PENDING (retried)", st)
	}
	if err := l.RemoveTopic(ctx, "m", "refused"); err != nil {
		t.Fatalf("remove of a PENDING topic: %v", err)
	}
	if topicOf("refused").Topic != "" {
		t.Fatal("the PENDING topic is still recorded after remove")
	}
}
