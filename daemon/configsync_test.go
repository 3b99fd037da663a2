package daemon

import (
	"context"
	"strings"
	"testing"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// TestTopicConfigSync: a config changed on the source topic after add
// reaches the mirror topic at the next round; an excluded config stays as
// the destination has it; a source that becomes compacted is not copied
// while mirroring and the topic says why (issue 21).
func TestTopicConfigSync(t *testing.T) {
	src, dst := addClusters(t, "cfg")
	l := addLeader(t, src, dst)
	ctx := context.Background()
	if err := l.store.Apply(ctx, raftstore.AlterMirror{Name: "m", Bootstrap: src.ListenAddrs(),
		Properties: map[string]string{"bootstrap.servers": src.ListenAddrs()[0], "topics.config.exclude": "segment.ms",
			"topics.config.sync.interval": "1h"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AddTopics(ctx, api.AddTopicsRequest{Mirror: "m", Topics: []string{"cfg"}}); err != nil {
		t.Fatal(err)
	}
	srcAdmin := kafka.NewAdmin("source", src.ListenAddrs(), "test", nil)
	defer srcAdmin.Close()
	if err := srcAdmin.AlterTopicConfigs(ctx, "cfg", map[string]string{"retention.ms": "123456", "segment.ms": "7654321"}); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncTopicConfigs(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	got, err := l.dest.TopicConfigs(ctx, "cfg")
	if err != nil {
		t.Fatal(err)
	}
	if got["retention.ms"] != "123456" {
		t.Fatalf("destination retention.ms %q after a sync, want the source's new 123456", got["retention.ms"])
	}
	if got["segment.ms"] == "7654321" {
		t.Fatal("an excluded config (segment.ms) was copied")
	}

	if err := srcAdmin.AlterTopicConfigs(ctx, "cfg", map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	if err := l.SyncTopicConfigs(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.dest.TopicConfigs(ctx, "cfg"); strings.Contains(got["cleanup.policy"], "compact") {
		t.Fatal("a source that became compacted was copied while mirroring")
	}
	var why string
	l.store.Read(func(s *raftstore.State) { why = s.Topics[raftstore.TopicKey("m", "cfg")].ConfigSyncError })
	if !strings.Contains(why, "cleanup.policy=compact") {
		t.Fatalf("the topic's config sync note %q, want it to name the held compaction", why)
	}

	// A cluster that does not answer stops the round with an error and
	// leaves the topics' notes alone: it is no fault of a topic, and a
	// broker restart must not leave every topic's reason stale.
	if err := l.store.Apply(ctx, raftstore.AlterMirror{Name: "m", Bootstrap: []string{"127.0.0.1:1"},
		Properties: map[string]string{"bootstrap.servers": "127.0.0.1:1", "topics.config.sync.interval": "1h"}}); err != nil {
		t.Fatal(err)
	}
	err = l.SyncTopicConfigs(ctx, "m")
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("a round against an unreachable source returned %v, want an unreachable error", err)
	}
	var after string
	l.store.Read(func(s *raftstore.State) { after = s.Topics[raftstore.TopicKey("m", "cfg")].ConfigSyncError })
	if after != why {
		t.Fatalf("an unreachable source changed the topic's config sync note from %q to %q", why, after)
	}
}
