package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// shareConsume runs Kafka's console share consumer in group until it has
// printed max records (each acknowledged as accepted, the consumer's
// implicit mode) and exited.
func shareConsume(t *testing.T, cl *harness.Cluster, topic, group string, max int) []consumed {
	t.Helper()
	return runConsole(t, cl, "org.apache.kafka.tools.consumer.ConsoleShareConsumer", topic, group, max, []string{
		"--bootstrap-server", cl.Bootstrap(), "--topic", topic, "--group", group, "--max-messages", strconv.Itoa(max), "--timeout-ms", "60000",
		"--formatter-property", "print.timestamp=true", "--formatter-property", "print.partition=true", "--formatter-property", "print.offset=true",
		"--formatter-property", "print.headers=true", "--formatter-property", "print.key=true"})
}

// setShareReset sets a share group's share.auto.offset.reset on cl (a
// group config, KIP-932; the default, latest, would skip a backlog).
func setShareReset(t *testing.T, cl *harness.Cluster, group, reset string) {
	t.Helper()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value = "share.auto.offset.reset", kmsg.StringPtr(reset)
	res.Configs = append(res.Configs, c)
	req.Resources = append(req.Resources, res)
	for _, r := range adminRequest(t, cl, req).(*kmsg.IncrementalAlterConfigsResponse).Resources {
		if r.ErrorCode != 0 {
			t.Fatalf("set share.auto.offset.reset of group %s: error %d %v", group, r.ErrorCode, r.ErrorMessage)
		}
	}
}

// shareStartOffsets reads a share group's start offsets of topic on cl
// with franz-go's request (not kmirror's): partition -> SPSO, partitions
// without state left out.
func shareStartOffsets(t *testing.T, cl *harness.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrDescribeShareGroupOffsetsRequest()
	g := kmsg.NewDescribeShareGroupOffsetsRequestGroup()
	g.GroupID = group
	rt := kmsg.NewDescribeShareGroupOffsetsRequestGroupTopic()
	rt.Topic, rt.Partitions = topic, []int32{0, 1} // the test topic's (a partition beyond the topic got no answer from 4.4.0)
	g.Topics = append(g.Topics, rt)
	req.Groups = append(req.Groups, g)
	// Straight to the (one) broker: franz-go's coordinator routing does
	// not know this request.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := kgoClient(t, cl)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	resp, err := c.DiscoveredBrokers()[0].Request(ctx, req)
	if err != nil {
		t.Fatalf("DescribeShareGroupOffsets of %s on %s: %v", group, cl.Bootstrap(), err)
	}
	out := map[int32]int64{}
	for _, rg := range resp.(*kmsg.DescribeShareGroupOffsetsResponse).Groups {
		for _, rt := range rg.Topics {
			for _, p := range rt.Partitions {
				if p.ErrorCode == 0 && p.StartOffset >= 0 {
					out[p.Partition] = p.StartOffset
				}
			}
		}
	}
	return out
}

// shareGroupSwitchover (issue 21, section 5): a share group on a 4.2+
// source reads part of a topic; its share-partition start offsets are
// synced to the destination (describe --groups, KIND share) and carried by
// remove --wait-for-sync; the same group on the destination reads the
// rest. Every record is read at least once; records read on both sides
// (redelivered: acknowledged above the start offset, or acquired and
// released at the consumer's close) are counted apart.
func shareGroupSwitchover(t *testing.T, src, dst *harness.Cluster, m *member, mirror string) {
	t.Helper()
	ctx := context.Background()
	const partitions = 2
	topic, group := mirror+"-share", mirror+"-sg"
	if err := src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src, kgo.ProducerBatchCompression(kgo.Lz4Compression())), keyedRecords(topic, 0, 400))
	setShareReset(t, src, group, "earliest")
	before := shareConsume(t, src, topic, group, 300) // more than a partition holds: both have a start offset
	if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: map[string]string{
		"bootstrap.servers": src.Bootstrap(), "groups.sync.interval": "300ms", "topics.config.sync.interval": "1s"}}); err != nil {
		t.Fatal(err)
	}
	addCaughtUp(t, m, mirror, topic)
	read := map[int32]bool{}
	for _, c := range before {
		read[c.partition] = true
	}
	rows := waitGroupRows(t, m, mirror, group, api.GroupSynced, "", len(read))
	for _, r := range rows {
		if r.Kind != "share" {
			t.Fatalf("share group row %+v: want KIND share", r)
		}
	}
	out, errOut, code := cli(t, m, "describe", "--groups", "--mirror", mirror)
	if code != 0 || !strings.Contains(out, group+" ") || !strings.Contains(out, " share ") {
		t.Fatalf("describe --groups: exit %d, want %s of KIND share\n%s%s", code, group, out, errOut)
	}
	if out, errOut, code := cli(t, m, "remove", "--mirror", mirror, "--topic", topic, "--wait-for-sync=2m"); code != 0 {
		t.Fatalf("remove --wait-for-sync: exit %d\n%s%s", code, out, errOut)
	}
	if out, _, _ := cli(t, m, "list"); strings.Contains(out, mirror+": ") {
		t.Fatalf("kmirror list names something turned off between two 4.4.0 clusters:\n%s", out)
	}
	// The destination group starts at the source's start offsets,
	// translated (the topic's plain records keep their offsets).
	final := readAll(t, src, topic, partitions, true)
	requireSameRecords(t, final, readAll(t, dst, topic, partitions, true))
	srcStart := shareStartOffsets(t, src, group, topic)
	start := shareStartOffsets(t, dst, group, topic)
	if len(srcStart) != partitions || fmt.Sprint(start) != fmt.Sprint(srcStart) {
		t.Fatalf("share group %s start offsets: %v on the destination, want the source's %v on every partition", group, start, srcStart)
	}
	n := 0
	for p := range final {
		n += len(final[p]) - int(start[int32(p)])
	}
	after := shareConsume(t, dst, topic, group, n)
	seen := map[int32]map[int64]int{}
	for _, c := range append(append([]consumed(nil), before...), after...) {
		if seen[c.partition] == nil {
			seen[c.partition] = map[int64]int{}
		}
		if want := printed(final[c.partition][c.offset]); c.line != want {
			t.Fatalf("partition %d offset %d: read %q, the source holds %q", c.partition, c.offset, c.line, want)
		}
		seen[c.partition][c.offset]++
	}
	again := 0
	for p := range final {
		for o := range final[p] {
			switch k := seen[int32(p)][int64(o)]; {
			case k == 0:
				t.Fatalf("partition %d offset %d was read on neither cluster (start offsets on the destination %v)", p, o, start)
			case k > 1:
				again += k - 1
			}
		}
	}
	perPartition := func(cs []consumed) map[int32]int {
		out := map[int32]int{}
		for _, c := range cs {
			out[c.partition]++
		}
		return out
	}
	t.Logf("share group %s over partitions of %d and %d records: read on the source %v, on the destination %v from start offsets %v; "+
		"%d records read on both (redelivered)", group, len(final[0]), len(final[1]), perPartition(before), perPartition(after), start, again)
}

// shareGroupUnsupported: a share group of a 4.2+ source mirrored into a
// destination without share groups is named on its rows (not a silent
// gap), and remove --wait-for-sync does not wait for it.
func shareGroupUnsupported(t *testing.T, src *harness.Cluster, m *member, mirror string) {
	t.Helper()
	ctx := context.Background()
	topic, group := mirror+"-share", mirror+"-sg"
	if err := src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, src), keyedRecords(topic, 0, 100))
	setShareReset(t, src, group, "earliest")
	shareConsume(t, src, topic, group, 100)
	if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: map[string]string{
		"bootstrap.servers": src.Bootstrap(), "groups.sync.interval": "300ms", "topics.config.sync.interval": "1s"}}); err != nil {
		t.Fatal(err)
	}
	// list names it for the mirror (the leader's config sync round
	// reads both clusters' ApiVersions).
	deadline := time.Now().Add(time.Minute)
	for {
		out, _, code := cli(t, m, "list")
		if code == 0 && strings.Contains(out, mirror+": share groups are not carried: the destination has no AlterShareGroupOffsets") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kmirror list does not say share groups are not carried into a 3.9.1 destination:\n%s", out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	addCaughtUp(t, m, mirror, topic)
	rows := waitGroupRows(t, m, mirror, group, api.GroupConflict, "the destination cluster has no share groups", 1)
	if !rows[0].Unsupported || rows[0].Kind != "share" {
		t.Fatalf("share group row into a cluster without share groups: %+v, want KIND share and unsupported", rows[0])
	}
	out, errOut, code := cli(t, m, "remove", "--mirror", mirror, "--topic", topic, "--wait-for-sync=1m")
	if code != 0 || !strings.Contains(out+errOut, "has no share groups") {
		t.Fatalf("remove --wait-for-sync with a share group the destination cannot take: exit %d, want 0 naming it\n%s%s", code, out, errOut)
	}
}
