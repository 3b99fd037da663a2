package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestACLSync (issue 21): with acls.sync=true, on clusters running
// StandardAuthorizer, the source's literal ACLs of a mirrored topic and a
// synced group reach the destination; an ALLOW WRITE waits for the
// failover (the mirror topic is read-only until then) and comes after
// it; a principal acls.exclude names and a prefixed binding are left
// out; an ACL deleted on the source is deleted on the destination; an
// application's DENY on the destination that kmirror did not create is
// never touched.
func TestACLSync(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	props := map[string]string{}
	for k, v := range brokerProps {
		props[k] = v
	}
	for k, v := range authorizerProps {
		props[k] = v
	}
	var clusters [2]*harness.Cluster
	for i, name := range []string{"aclsrc", "acldst"} {
		cl, err := harness.Start(ctx, harness.Options{Name: name, BrokerProps: props})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		clusters[i] = cl
	}
	srcCl, dstCl := clusters[0], clusters[1]
	src := kafka.NewAdmin("source", []string{srcCl.Bootstrap()}, "test", nil)
	defer src.Close()
	dst := kafka.NewAdmin("destination", []string{dstCl.Bootstrap()}, "test", nil)
	defer dst.Close()

	const topic = "acl-t"
	if err := srcCl.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	acl := func(rt int8, name string, pattern int8, principal string, op, perm int8) kafka.ACL {
		return kafka.ACL{ResourceType: rt, Name: name, PatternType: pattern, Principal: principal, Host: "*", Operation: op, Permission: perm}
	}
	readTopic := acl(kafka.ACLResourceTopic, topic, kafka.ACLLiteral, "User:alice", kafka.ACLOperationRead, kafka.ACLAllow)
	writeTopic := acl(kafka.ACLResourceTopic, topic, kafka.ACLLiteral, "User:alice", kafka.ACLWrite, kafka.ACLAllow)
	readGroup := acl(kafka.ACLResourceGroup, "app-g", kafka.ACLLiteral, "User:alice", kafka.ACLOperationRead, kafka.ACLAllow)
	excluded := acl(kafka.ACLResourceTopic, topic, kafka.ACLLiteral, "User:eve", kafka.ACLOperationRead, kafka.ACLAllow)
	prefixed := acl(kafka.ACLResourceTopic, "acl-", 4, "User:alice", kafka.ACLOperationRead, kafka.ACLAllow)
	appDeny := acl(kafka.ACLResourceTopic, topic, kafka.ACLLiteral, "User:carol", kafka.ACLOperationRead, kafka.ACLDeny)
	if err := src.CreateACLs(ctx, []kafka.ACL{readTopic, writeTopic, readGroup, excluded, prefixed}); err != nil {
		t.Fatal(err)
	}
	if err := dst.CreateACLs(ctx, []kafka.ACL{appDeny}); err != nil {
		t.Fatal(err)
	}

	m := startMember(t, "aclsync", memberOpts{destination: dstCl.Bootstrap()})
	m.src = srcCl
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "acl", Properties: map[string]string{
		"bootstrap.servers": srcCl.Bootstrap(), "acls.sync": "true", "acls.exclude": "User:eve", "topics.config.sync.interval": "1000"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "acl", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	destACLs := func() []kafka.ACL {
		var out []kafka.ACL
		for _, rt := range []int8{kafka.ACLResourceTopic, kafka.ACLResourceGroup} {
			acls, err := dst.ListACLs(ctx, rt)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, acls...)
		}
		return out
	}
	waitACLs := func(what string, ok func([]kafka.ACL) bool) []kafka.ACL {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got := destACLs()
			if ok(got) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: destination ACLs after 30 s: %v\n%s", what, got, m.logTail())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	got := waitACLs("the topic and group ACLs copied", func(a []kafka.ACL) bool {
		return slices.Contains(a, readTopic) && slices.Contains(a, readGroup)
	})
	for _, not := range []kafka.ACL{writeTopic, excluded, prefixed} {
		if slices.Contains(got, not) {
			t.Fatalf("copied %v, which must not be (read-only mirror topic, excluded principal, prefixed): %v", not, got)
		}
	}
	if !slices.Contains(got, appDeny) {
		t.Fatalf("the application's DENY on the destination is gone: %v", got)
	}

	if err := src.DeleteACLs(ctx, []kafka.ACL{readTopic}); err != nil {
		t.Fatal(err)
	}
	waitACLs("an ACL deleted on the source deleted on the destination", func(a []kafka.ACL) bool {
		return !slices.Contains(a, readTopic) && slices.Contains(a, readGroup) && slices.Contains(a, appDeny)
	})

	// Failover: the topic is the writable copy now, and gets the ALLOW WRITE.
	if err := m.client.RemoveTopic(ctx, "acl", topic); err != nil {
		t.Fatal(err)
	}
	waitACLs("ALLOW WRITE after the failover", func(a []kafka.ACL) bool { return slices.Contains(a, writeTopic) && slices.Contains(a, appDeny) })
}
