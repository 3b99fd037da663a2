package daemon

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// TestAddKeepsUnansweredCreationPending: in an add of several topics, a
// destination topic creation that gets no answer (the broker may have
// created it) leaves that topic PENDING, which the leader finishes, and
// the add goes on with the others and reports each topic's result; it
// is never removed half-done (issue 18: a big add left one topic
// half-undone and did not say which).
func TestAddKeepsUnansweredCreationPending(t *testing.T) {
	src, dst := addClusters(t, "a1", "a2", "a3")
	var timedOut atomic.Int32
	dst.ControlKey(int16(kmsg.CreateTopics), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		dst.KeepControl()
		req := kr.(*kmsg.CreateTopicsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != "a2" || timedOut.Load() > 0 {
			return nil, nil, false // only the add's creation of a2 gets no answer
		}
		timedOut.Add(1)
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		rt := kmsg.NewCreateTopicsResponseTopic()
		rt.Topic, rt.ErrorCode = "a2", kerr.RequestTimedOut.Code
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	l := addLeader(t, src, dst)
	ctx := context.Background()
	res, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m", Topics: []string{"a1", "a2", "a3"}})
	if err != nil {
		t.Fatalf("add with one unanswered creation: %v", err)
	}
	if timedOut.Load() == 0 {
		t.Fatal("the creation of a2 was never refused: the test did not exercise an unanswered creation")
	}
	want := map[string]string{"a1": api.TopicAdded, "a2": api.TopicPending, "a3": api.TopicAdded}
	if len(res.Topics) != 3 {
		t.Fatalf("per-topic results %+v, want one for each of 3 topics", res.Topics)
	}
	for _, r := range res.Topics {
		if r.Result != want[r.Topic] {
			t.Errorf("topic %s: %s (%s), want %s", r.Topic, r.Result, r.Error, want[r.Topic])
		}
	}
	stateOf := func(topic string) raftstore.TopicState {
		var st raftstore.TopicState
		l.store.Read(func(s *raftstore.State) {
			if p, ok := s.Topic("m", topic); ok {
				st = p.State
			}
		})
		return st
	}
	// The leader finishes a2 (the control answered only once).
	waitFor(t, 20*time.Second, "the pending topic a2 to be finished by the leader", func() bool { return stateOf("a2") == raftstore.StateMirroring })
	for _, topic := range []string{"a1", "a3"} {
		if st := stateOf(topic); st != raftstore.StateMirroring {
			t.Errorf("topic %s is %s, want MIRRORING", topic, st)
		}
	}
}

// TestAddOutlivesItsClient: a client that gives up in the middle of an add
// (the CLI's timeout, a closed connection) does not stop it halfway: the
// topics still to create are created (issue 18).
func TestAddOutlivesItsClient(t *testing.T) {
	topics := []string{"b1", "b2", "b3"}
	src, dst := addClusters(t, topics...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dst.ControlKey(int16(kmsg.CreateTopics), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		cancel() // the client gives up while the first topic is created
		return nil, nil, false
	})
	l := addLeader(t, src, dst)
	res, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m", Topics: topics})
	t.Logf("add: %+v, %v", res, err)
	for _, topic := range topics {
		waitFor(t, 20*time.Second, "topic "+topic+" to be MIRRORING", func() bool {
			var st raftstore.TopicState
			l.store.Read(func(s *raftstore.State) {
				if p, ok := s.Topic("m", topic); ok {
					st = p.State
				}
			})
			return st == raftstore.StateMirroring
		})
	}
}

// addClusters starts a kfake source holding topics (two partitions each)
// and an empty kfake destination.
func addClusters(t *testing.T, topics ...string) (src, dst *kfake.Cluster) {
	t.Helper()
	var err error
	if src, err = kfake.NewCluster(kfake.NumBrokers(1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	if dst, err = kfake.NewCluster(kfake.NumBrokers(1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dst.Close)
	for _, topic := range topics {
		if err := src.CreateTopic(topic, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	return src, dst
}

// addLeader is a one-member group on dst with mirror m of src.
func addLeader(t *testing.T, src, dst *kfake.Cluster) *Member {
	t.Helper()
	dest := kafka.NewAdmin("destination cluster", dst.ListenAddrs(), "test", nil)
	t.Cleanup(dest.Close)
	l := newGroupWith(t, 1, 2*time.Second, dest).leader()
	if err := l.store.Apply(context.Background(), raftstore.CreateMirror{Mirror: raftstore.Mirror{Name: "m", Bootstrap: src.ListenAddrs()}}); err != nil {
		t.Fatal(err)
	}
	return l
}
