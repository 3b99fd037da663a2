package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestPatternBeyondDestinationPartitionLimit (issue 21, section 2): a
// pattern matches more partitions than the destination allows (a
// create-topic policy capping user partitions at 6, as managed services
// do; stock Kafka has no cap). The topics that fit are added and mirrored
// record by record; the one that does not is refused, named with the
// broker's words in add's reply and as SKIPPED in describe, and nothing of
// it is left on the destination.
func TestPatternBeyondDestinationPartitionLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	libs, err := harness.Libs()
	if err != nil {
		t.Fatal(err)
	}
	classes := t.TempDir()
	javac := exec.CommandContext(ctx, "javac", "-cp", filepath.Join(libs, "*"), "-d", classes, "testdata/policy/PartitionLimitPolicy.java")
	if out, err := javac.CombinedOutput(); err != nil {
		t.Fatalf("javac PartitionLimitPolicy (the JDK's javac is needed: .ci/run installs openjdk-17-jdk-headless): %v\n%s", err, out)
	}
	dst, err := harness.Start(ctx, harness.Options{Name: "limited", BrokerProps: map[string]string{
		"create.topic.policy.class.name": "PartitionLimitPolicy", "kmirror.test.partition.limit": "6"}, Classpath: []string{classes}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	m := startMember(t, "limited", memberOpts{destination: dst.Bootstrap()})
	m.src = env.src
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "lim", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	topics := []string{"lim.a", "lim.b", "lim.c", "lim.d"}
	for _, tp := range topics {
		if err := env.src.CreateTopic(ctx, tp, 2, 1, nil); err != nil {
			t.Fatal(err)
		}
		produceSync(t, kgoClient(t, env.src), keyedRecords(tp, 0, 40))
	}
	out, errOut, code := cli(t, m, "add", "--mirror", "lim", "--include", `lim\..*`)
	if code != 0 {
		t.Fatalf("add --include: exit %d\n%s%s", code, out, errOut)
	}
	var added, refused []string
	for _, tp := range topics {
		switch {
		case strings.Contains(out, "skipped "+tp+": ") && strings.Contains(out, "partition limit reached"):
			refused = append(refused, tp)
		case strings.Contains(out, tp):
			added = append(added, tp)
		}
	}
	if len(added) != 3 || len(refused) != 1 {
		t.Fatalf("add --include over a destination that takes 6 partitions: added %v, refused %v; want 3 and 1 named with the broker's words\n%s",
			added, refused, out)
	}
	waitCaughtUp(t, m, "lim", added...)
	for _, tp := range added {
		requireSameRecords(t, readAll(t, env.src, tp, 2, true), readAll(t, dst, tp, 2, true))
	}
	rows, err := m.client.Describe(ctx, "lim", refused[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].State != api.StateSkipped || !strings.Contains(rows[0].Reason, "partition limit reached") {
		t.Fatalf("describe of the refused %s: %+v, want one SKIPPED row with the policy's words", refused[0], rows)
	}
	for _, mt := range adminRequest(t, dst, kmsg.NewPtrMetadataRequest()).(*kmsg.MetadataResponse).Topics {
		if mt.Topic != nil && *mt.Topic == refused[0] {
			t.Fatalf("the refused %s exists on the destination", refused[0])
		}
	}
}
