package mirrorprops

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

func TestParseMirrorSettings(t *testing.T) {
	s, err := Parse("m1", map[string]string{"bootstrap.servers": "a:9092, b:9092"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Bootstrap) != 2 || s.GroupSyncInterval != 5*time.Second || !s.SyncsGroup("anything") || s.DiscoveryInterval != 30*time.Second {
		t.Fatalf("defaults: %+v", s)
	}
	s, err = Parse("m1", map[string]string{"bootstrap.servers": "a:9092", "groups.include": "orders-.*|billing",
		"groups.exclude": "orders-test.*", "groups.sync.interval": "1500"})
	if err != nil {
		t.Fatal(err)
	}
	for group, want := range map[string]bool{"orders-1": true, "billing": true, "billing-2": false, "orders-test-1": false, "xorders-1": false} {
		if got := s.SyncsGroup(group); got != want {
			t.Errorf("SyncsGroup(%q) = %t, want %t (whole-name match, exclude wins)", group, got, want)
		}
	}
	if s.FailoverAutoAfter != 0 {
		t.Errorf("automatic failover is on by default: %s", s.FailoverAutoAfter)
	}
	hook := map[string]string{"bootstrap.servers": "a:9092", "failover.hook.exec": "switch-dns.sh", "failover.hook.url": "https://gw/failover",
		"failover.hook.timeout.ms": "2500", "failover.hook.retries": "0"}
	if s, err := Parse("m1", hook); err != nil || s.Hook != (Hook{Exec: "switch-dns.sh", URL: "https://gw/failover", Timeout: 2500 * time.Millisecond}) {
		t.Errorf("failover hook properties: %+v, %v", s.Hook, err)
	}
	if s, err := Parse("m1", map[string]string{"bootstrap.servers": "a:9092", "verify.mode": "sampled", "verify.records.per.sec": "50"}); err != nil ||
		s.Verify != (Verify{Mode: VerifySampled, RecordsPerSec: 50, BytesPerSec: DefaultVerifyBytes}) {
		t.Errorf("verify properties: %+v, %v", s.Verify, err)
	}
	if s, err := Parse("m1", map[string]string{"bootstrap.servers": "a:9092"}); err != nil || s.Hook != (Hook{Timeout: DefaultHookTimeout, Retries: DefaultHookRetries}) ||
		s.Verify.Mode != VerifyOff {
		t.Errorf("no failover hook: %+v, %v", s.Hook, err)
	}
	if s, err := Parse("m1", map[string]string{"bootstrap.servers": "a:9092", "failover.auto.after.ms": "30000"}); err != nil || s.FailoverAutoAfter != 30*time.Second {
		t.Errorf("failover.auto.after.ms=30000: %s, %v", s.FailoverAutoAfter, err)
	}
	if s, err := Parse("m1", map[string]string{"bootstrap.servers": "a:9092", "fetch.connections": " 6 "}); err != nil || s.FetchConnections != 6 {
		t.Errorf("fetch.connections=6: %d, %v", s.FetchConnections, err)
	}
	mir := raftstore.Mirror{Name: "m1", Bootstrap: []string{"a:9092"}, Properties: map[string]string{"bootstrap.servers": "a:9092"}}
	if got := Source(mir).FetchConnections; got != 0 {
		t.Errorf("without fetch.connections the source asks for %d connections, want 0 (sized from the round trip)", got)
	}
	plain := SourceKey(mir)
	mir.Properties["fetch.connections"] = "6"
	if got := Source(mir).FetchConnections; got != 6 || SourceKey(mir) != plain {
		t.Errorf("fetch.connections=6: the source asks for %d connections (want 6), key changed %t (want false: no new connections needed)", got, SourceKey(mir) != plain)
	}
	if s.GroupSyncInterval != 1500*time.Millisecond {
		t.Errorf("groups.sync.interval=1500 gave %s, want 1.5s (milliseconds)", s.GroupSyncInterval)
	}
	for _, tc := range []struct {
		props map[string]string
		want  string
	}{
		{map[string]string{"bootstrap.servers": "a:9092", "groups.include": "("}, "groups.include=( is not a regular expression"},
		{map[string]string{"bootstrap.servers": "a:9092", "groups.sync.interval": "10ms"}, "at least 100ms"},
		{map[string]string{"bootstrap.servers": "a:9092", "topics.discovery.interval": "100"}, "topics.discovery.interval=100: give a duration of at least 500ms"},
		{map[string]string{"bootstrap.servers": "a:9092", "acls.sync": "yes"}, "acls.sync=yes: give true or false"},
		{map[string]string{"bootstrap.servers": "a:9092", "acls.include": "User:("}, "acls.include=User:( is not a regular expression"},
		{map[string]string{"bootstrap.servers": "a:9092", "topics.config.sync.interval": "10ms"}, "topics.config.sync.interval=10ms: give a duration of at least 1s"},
		{map[string]string{"bootstrap.servers": "a:9092", "topics.config.exclude": "retention.ms, min.insync.replicas"},
			"topics.config.exclude lists min.insync.replicas, which kmirror does not copy"},
		{map[string]string{"bootstrap.servers": "a:9092", "groups.sync.interval": "soon"}, "groups.sync.interval=soon"},
		{map[string]string{"bootstrap.servers": "a:9092", "security.protocol": "SSL", "ssl.truststore.locaton": "/ca.pem"},
			"mirror m1: unsupported mirror properties ssl.truststore.locaton: ssl.truststore.locaton: did you mean ssl.truststore.location?"},
		{map[string]string{"bootstrap.servers": "a:9092", "sasl.mechanism": "PLAIN"}, "sasl.mechanism is set but security.protocol=PLAINTEXT does not use SASL"},
		{map[string]string{"groups.include": ".*"}, "need bootstrap.servers"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.auto.after.ms": "500"}, "at least 3000"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.auto.after.ms": "30s"}, "give milliseconds"},
		{map[string]string{"bootstrap.servers": "a:9092", "fetch.connections": "0"}, "fetch.connections=0: give a count of connections per source broker from 1 to 32"},
		{map[string]string{"bootstrap.servers": "a:9092", "fetch.connections": "many"}, "fetch.connections=many"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.exec": "/usr/bin/curl -X POST x"}, "failover.hook.exec=/usr/bin/curl -X POST x: give the file name of an executable in each member's hooks_dir"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.exec": "../bin/sh"}, "not a path or a command line"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.url": "dns-switch:8080/x"}, "give an http:// or https:// URL"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.url": "http://a/x", "failover.hook.timeout.ms": "10s"}, "failover.hook.timeout.ms=10s: give milliseconds from 100 to 600000"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.url": "http://a/x", "failover.hook.retries": "-1"}, "failover.hook.retries=-1"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.retries": "3"}, "set without a hook: add failover.hook.exec or failover.hook.url"},
		{map[string]string{"bootstrap.servers": "a:9092", "failover.hook.url": "https://gw/x?[hidden]"}, "holds [hidden], as kmirror list shows it"},
		{map[string]string{"bootstrap.servers": "a:9092", "verify.mode": "always"}, "verify.mode=always: give off, sampled"},
		{map[string]string{"bootstrap.servers": "a:9092", "verify.mode": "full", "verify.records.per.sec": "0"}, "verify.records.per.sec=0: give a positive whole number"},
		{map[string]string{"bootstrap.servers": "a:9092", "verify.bytes.per.sec": "1MiB"}, "verify.bytes.per.sec=1MiB"},
	} {
		_, err := Parse("m1", tc.props)
		if !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want ErrInvalid with %q", tc.props, err, tc.want)
		}
	}
}

// TestSourceClientID: the client.id property is the client.id used on the
// source (it was accepted and ignored before), and changing it changes the
// source's key, so connections are made again with it.
func TestSourceClientID(t *testing.T) {
	mir := raftstore.Mirror{Name: "m1", Bootstrap: []string{"a:9092"}, Properties: map[string]string{"bootstrap.servers": "a:9092"}}
	plain := SourceKey(mir)
	if got := Source(mir).ClientID; got != "" {
		t.Fatalf("without client.id the source's client ID is %q, want the member's (empty here)", got)
	}
	mir.Properties["client.id"] = " dr-mirror "
	if got := Source(mir).ClientID; got != "dr-mirror" {
		t.Fatalf("source client ID %q, want dr-mirror", got)
	}
	if SourceKey(mir) == plain {
		t.Fatal("a new client.id did not change the source's key")
	}
}

// TestTopicPattern: a topic pattern matches whole names; a bad or empty
// one is refused naming the flag, with an example.
func TestTopicPattern(t *testing.T) {
	re, err := TopicPattern("--include", `orders\..*`)
	if err != nil || !re.MatchString("orders.eu") || re.MatchString("xorders.eu") || re.MatchString("orders") {
		t.Fatalf("orders\\..*: %v, matches orders.eu %t, xorders.eu %t", err, re.MatchString("orders.eu"), re.MatchString("xorders.eu"))
	}
	for _, bad := range []string{"(", " "} {
		if _, err := TopicPattern("--exclude", bad); err == nil || !strings.Contains(err.Error(), "--exclude") || !strings.Contains(err.Error(), "e.g.") {
			t.Errorf("pattern %q: %v, want an error naming --exclude with an example", bad, err)
		}
	}
}

// TestRedactURL: a webhook URL's user information and query (where
// tokens go) are hidden in errors, logs and kmirror list.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@gw.example/x?token=1": "https://[hidden]@gw.example/x?[hidden]",
		"http://gw.example:8080/failover":      "http://gw.example:8080/failover",
		"http://gw.example/f#frag":             "http://gw.example/f?[hidden]",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
