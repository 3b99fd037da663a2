package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
)

// cli runs the real kmirror binary against m and returns stdout, stderr
// and the exit code.
func cli(t *testing.T, m *member, args ...string) (string, string, int) {
	t.Helper()
	return cliArgs(t, append([]string{"--server", m.url}, args...)...)
}

// cliArgs runs the real kmirror binary with exactly args.
func cliArgs(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.bin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBadInput feeds the CLI and API wrong requests: each gets one clear
// line naming what was wrong, a non-zero exit, and nothing half-created.
func TestBadInput(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	if err := env.src.CreateTopic(ctx, "bad-good", 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := env.src.CreateTopic(ctx, "bad-taken", 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	if err := env.dst.CreateTopic(ctx, "bad-taken", 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	good := writeFile(t, "good.properties", "bootstrap.servers="+env.src.Bootstrap()+"\n")
	// A mirror of this test's own, with one mirroring topic.
	if err := env.src.CreateTopic(ctx, "bad-mirrored", 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := cli(t, m, "create", "--mirror", "badm", "--mirror-config", good); code != 0 {
		t.Fatalf("create badm: %s", stderr)
	}
	if _, stderr, code := cli(t, m, "add", "--mirror", "badm", "--topic", "bad-mirrored"); code != 0 {
		t.Fatalf("add bad-mirrored: %s", stderr)
	}
	cases := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"malformed properties", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "bad.properties", "# ok\nbootstrap.servers=a:1\nthis line has no separator\n")}, "line 3"},
		{"properties without bootstrap", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "nob.properties", "client.id=a\n")}, "bootstrap.servers"},
		{"unreachable source", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "dead.properties", "bootstrap.servers=127.0.0.1:1\n")}, "127.0.0.1:1"},
		{"unsupported property", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "tls.properties", "bootstrap.servers=a:1\nssl.truststore.location=/x\n")}, "ssl.truststore.location"},
		{"duplicate create", []string{"create", "--mirror", "badm", "--mirror-config", good}, "already exists"},
		{"unknown mirror", []string{"add", "--mirror", "nope", "--topic", "bad-good"}, "mirror nope does not exist"},
		{"missing source topic", []string{"add", "--mirror", "badm", "--topic", "bad-good", "--topic", "no-such-topic"}, "no-such-topic does not exist"},
		{"destination topic not ours", []string{"add", "--mirror", "badm", "--topic", "bad-taken"}, "bad-taken already exists"},
		{"bad start-from", []string{"add", "--mirror", "badm", "--topic", "bad-good", "--start-from", "middle"}, "start-from"},
		{"remove unknown topic", []string{"remove", "--mirror", "badm", "--topic", "no-such-topic"}, "no topic no-such-topic"},
		{"describe unknown mirror", []string{"describe", "--mirror", "nope"}, "mirror nope does not exist"},
		{"delete with mirroring topics", []string{"delete", "--mirror", "badm"}, "--force"},
		{"add topic mirrored already", []string{"add", "--mirror", "badm", "--topic", "bad-mirrored"}, "already mirrored"},
		{"bootstrap without a port", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "noport.properties", "bootstrap.servers=localhost\n")}, "not host:port"},
		{"bootstrap at an HTTP port", []string{"create", "--mirror", "x", "--mirror-config",
			writeFile(t, "http.properties", "bootstrap.servers="+strings.TrimPrefix(m.url, "http://")+"\n")}, "answered in HTTP"},
		{"bad topic name", []string{"add", "--mirror", "badm", "--topic", "bad name!"}, "topic name"},
		{"replication factor above the brokers", []string{"add", "--mirror", "badm", "--topic", "bad-good", "--replication-factor", "3"},
			"Invalid Replication Factor"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := cli(t, m, c.args...)
			if code == 0 {
				t.Fatalf("exit 0, want failure")
			}
			if !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
				t.Fatalf("stderr %q: want one line containing %q", stderr, c.want)
			}
		})
	}
	// What the caller must fix is a 400, not "dependency unavailable".
	for _, req := range []api.AddTopicsRequest{
		{Mirror: "badm", Topics: []string{"bad name!"}},
		{Mirror: "badm", Topics: []string{"bad-good"}, ReplicationFactor: 3},
	} {
		if _, err := m.client.AddTopics(ctx, req); !errors.Is(err, api.ErrInvalid) {
			t.Fatalf("add %+v: %v, want an invalid-request error", req, err)
		}
	}
	// Nothing was half-created by the failed requests.
	list, err := m.client.ListMirrors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mi := range list {
		if mi.Name == "x" {
			t.Fatalf("mirror x exists after failed creates: %+v", mi)
		}
		for _, tp := range mi.Topics {
			if tp == "bad-good" || tp == "bad-taken" {
				t.Fatalf("topic %s was added by a failed request", tp)
			}
		}
	}
	if topicExists(t, "bad-good") {
		t.Fatal("destination topic bad-good was created by a failed add")
	}
	// And the good request still works afterwards.
	if _, stderr, code := cli(t, m, "add", "--mirror", "badm", "--topic", "bad-good"); code != 0 {
		t.Fatalf("add bad-good: %s", stderr)
	}
	waitCaughtUp(t, m, "badm", "bad-good", "bad-mirrored")
	// delete --force stops the topics and removes the mirror.
	if _, stderr, code := cli(t, m, "delete", "--mirror", "badm", "--force"); code != 0 {
		t.Fatalf("delete --force: %s", stderr)
	}
	out, stderr, code := cli(t, m, "list")
	if code != 0 || strings.Contains(out, "badm") {
		t.Fatalf("after delete --force, list = %q %q", out, stderr)
	}
}

// topicExists asks the destination cluster's metadata, with franz-go.
func topicExists(t *testing.T, topic string) bool {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), kgoClient(t, env.dst))
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Topics) == 1 && resp.Topics[0].ErrorCode == 0
}
