package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// Consumer group offset sync (issue 8 section 1) with real consumers: the
// Kafka console consumer in a group, on the source and then on the
// destination, and Kafka's consumer-groups tool to read committed offsets.

// consumed is one record as the console consumer printed it.
type consumed struct {
	partition int32
	offset    int64
	line      string // timestamp, headers, key and value as printed
}

// consoleArgs are the console consumer's arguments for a group: one
// record per poll, so the offsets it commits on exit are exactly after
// the records it printed.
func consoleArgs(cl *harness.Cluster, topic, group, protocol string, max int) []string {
	return []string{"--bootstrap-server", cl.Bootstrap(), "--topic", topic, "--group", group,
		"--max-messages", strconv.Itoa(max), "--timeout-ms", "60000", "--from-beginning",
		"--consumer-property", "group.protocol=" + protocol,
		"--consumer-property", "max.poll.records=1",
		"--consumer-property", "isolation.level=read_committed",
		"--property", "print.timestamp=true", "--property", "print.partition=true", "--property", "print.offset=true",
		"--property", "print.headers=true", "--property", "print.key=true"}
}

// consoleConsume runs the console consumer until it has printed max
// records and exited (committing its position on close).
func consoleConsume(t *testing.T, cl *harness.Cluster, topic, group, protocol string, max int) []consumed {
	t.Helper()
	return runConsole(t, cl, "org.apache.kafka.tools.consumer.ConsoleConsumer", topic, group, max, consoleArgs(cl, topic, group, protocol, max))
}

// runConsole runs one of Kafka's console consumers (mainClass) and
// returns the max records it must have printed.
func runConsole(t *testing.T, cl *harness.Cluster, mainClass, topic, group string, max int, args []string) []consumed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := cl.Java(ctx, mainClass, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s of %s (group %s): %v\n%s", mainClass, topic, group, err, errb.String())
	}
	recs := parseConsole(t, out.String())
	if len(recs) != max {
		t.Fatalf("%s of %s (group %s) printed %d records, want %d\n%s", mainClass, topic, group, len(recs), max, errb.String())
	}
	return recs
}

// parseConsole reads "CreateTime:ts\tPartition:p\tOffset:o\theaders\tkey\tvalue" lines.
func parseConsole(t *testing.T, out string) []consumed {
	t.Helper()
	var recs []consumed
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 6)
		if len(f) != 6 || !strings.HasPrefix(f[1], "Partition:") || !strings.HasPrefix(f[2], "Offset:") {
			t.Fatalf("console consumer line %q is not timestamp, partition, offset, headers, key, value", sc.Text())
		}
		p, _ := strconv.Atoi(strings.TrimPrefix(f[1], "Partition:"))
		o, _ := strconv.ParseInt(strings.TrimPrefix(f[2], "Offset:"), 10, 64)
		recs = append(recs, consumed{partition: int32(p), offset: o, line: strings.Join([]string{f[0], f[3], f[4], f[5]}, "\t")})
	}
	return recs
}

// printed is how the console consumer prints r (see parseConsole).
func printed(r *kgo.Record) string {
	hs := "NO_HEADERS"
	if len(r.Headers) > 0 {
		var parts []string
		for _, h := range r.Headers {
			parts = append(parts, h.Key+":"+string(h.Value))
		}
		hs = strings.Join(parts, ",")
	}
	key := "null"
	if r.Key != nil {
		key = string(r.Key)
	}
	return fmt.Sprintf("CreateTime:%d\t%s\t%s\t%s", r.Timestamp.UnixMilli(), hs, key, r.Value)
}

// requireExactUnion checks that what a group read on the source and then
// on the destination is, per partition, the source's records in order:
// none twice, none missing.
func requireExactUnion(t *testing.T, src [][]*kgo.Record, before, after []consumed) {
	t.Helper()
	got := make([][]string, len(src))
	for _, c := range append(append([]consumed(nil), before...), after...) {
		got[c.partition] = append(got[c.partition], c.line)
	}
	total := 0
	for p := range src {
		if len(got[p]) != len(src[p]) {
			t.Fatalf("partition %d: the group read %d records on the two clusters, the source holds %d", p, len(got[p]), len(src[p]))
		}
		for i, r := range src[p] {
			if want := printed(r); got[p][i] != want {
				t.Fatalf("partition %d record %d: the group read %q, the source holds %q", p, i, got[p][i], want)
			}
		}
		total += len(src[p])
	}
	if len(before) == 0 || len(after) == 0 || total == 0 {
		t.Fatalf("the group read %d records on the source and %d on the destination: the test must split the topic", len(before), len(after))
	}
}

// committedByTool reads a group's committed offsets of topic with Kafka's
// consumer-groups tool (partition -> offset; partitions without one left out).
func committedByTool(t *testing.T, cl *harness.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := cl.Java(ctx, "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
		"--bootstrap-server", cl.Bootstrap(), "--describe", "--group", group)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kafka-consumer-groups --describe --group %s: %v\n%s", group, err, out)
	}
	got := map[int32]int64{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != group || f[1] != topic {
			continue
		}
		p, err1 := strconv.Atoi(f[2])
		o, err2 := strconv.ParseInt(f[3], 10, 64)
		if err1 == nil && err2 == nil {
			got[int32(p)] = o
		}
	}
	return got
}

// waitGroupSynced waits until describe --groups shows every partition the
// source group committed as synced, at the exact translation of its
// source offset, and returns the destination offsets.
func waitGroupSynced(t *testing.T, m *member, mirror, group, topic string, srcCommitted map[int32]int64) map[int32]int64 {
	t.Helper()
	ctx := context.Background()
	want := map[int32]int64{}
	for p, o := range srcCommitted {
		tr, err := m.client.Translate(ctx, mirror, topic, p, o)
		if err != nil {
			t.Fatalf("translate %s/%d offset %d: %v", topic, p, o, err)
		}
		want[p] = tr.DestinationOffset
	}
	deadline := time.Now().Add(time.Minute)
	var rows []api.GroupStatus
	for {
		var err error
		rows, err = m.client.DescribeGroups(ctx, mirror)
		if err != nil {
			t.Fatal(err)
		}
		synced := 0
		for _, r := range rows {
			if r.Group == group && r.Topic == topic && r.State == api.GroupSynced &&
				r.SourceCommitted == srcCommitted[r.Partition] && r.DestinationCommitted == want[r.Partition] {
				synced++
			}
		}
		if synced == len(srcCommitted) {
			return want
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s not synced within a minute: want destination %v for source %v; rows %+v", group, want, srcCommitted, rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// groupMember starts a member of its own with mirror "gs" syncing groups
// every 300 ms.
func groupMember(t *testing.T, name string) *member {
	t.Helper()
	m := startMember(t, name, memberOpts{})
	if err := m.client.CreateMirror(context.Background(), api.CreateMirrorRequest{Name: "gs", Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "groups.sync.interval": "300ms", "groups.exclude": "ignored-.*",
	}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// handoff runs the exact group handoff on topic: a group reads n1 records
// on the source, the group is synced, and the same group reads the rest
// on the destination.
func handoff(t *testing.T, m *member, topic string, partitions int, group, protocol string, n1 int) {
	t.Helper()
	src := readAll(t, env.src, topic, partitions, true)
	total := 0
	for _, p := range src {
		total += len(p)
	}
	start := time.Now()
	before := consoleConsume(t, env.src, topic, group, protocol, n1)
	exited := time.Now()
	srcCommitted := committedByTool(t, env.src, group, topic)
	want := waitGroupSynced(t, m, "gs", group, topic, srcCommitted)
	t.Logf("group %s (%s): synced %s after the source consumer exited (it ran %s)", group, protocol,
		time.Since(exited).Round(time.Millisecond), exited.Sub(start).Round(time.Millisecond))
	if got := committedByTool(t, env.dst, group, topic); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("kafka-consumer-groups on the destination shows %v for group %s, want %v (the translation of the source's %v)", got, group, want, srcCommitted)
	}
	after := consoleConsume(t, env.dst, topic, group, protocol, total-n1)
	requireExactUnion(t, src, before, after)
}

// TestGroupSyncHandoff: a group that read part of a topic on the source
// reads exactly the rest on the destination, with the classic and the
// KIP-848 consumer protocol, on a plain, a transactional and a compacted
// topic.
func TestGroupSyncHandoff(t *testing.T) {
	m := groupMember(t, "gs-handoff")
	ctx := context.Background()
	sc := kgoClient(t, env.src, kgo.ProducerLinger(0))

	const plain = "gs-plain"
	if err := env.src.CreateTopic(ctx, plain, 3, 1, nil); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := 0; i < 300; i++ {
		recs = append(recs, &kgo.Record{Topic: plain, Partition: int32(i % 3), Key: []byte(fmt.Sprint("k", i)),
			Value: []byte(fmt.Sprint("plain-", i)), Headers: []kgo.RecordHeader{{Key: "h", Value: []byte(fmt.Sprint(i))}}})
	}
	sc2 := kgoClient(t, env.src, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceSync(t, sc2, recs)
	addCaughtUp(t, m, "gs", plain)
	t.Run("classic", func(t *testing.T) { handoff(t, m, plain, 3, "gs-classic", "classic", 120) })
	t.Run("consumer", func(t *testing.T) { handoff(t, m, plain, 3, "gs-consumer", "consumer", 170) })

	t.Run("transactional", func(t *testing.T) {
		const topic = "gs-txn"
		if err := env.src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
			t.Fatal(err)
		}
		if err := runTransactions(ctx, "gs", topic, 2, 16); err != nil {
			t.Fatal(err)
		}
		addCaughtUp(t, m, "gs", topic)
		src := readAll(t, env.src, topic, 2, true)
		n := len(src[0]) + len(src[1])
		if n == 0 {
			t.Fatal("no committed transaction: nothing to read")
		}
		handoff(t, m, topic, 2, "gs-txn-classic", "classic", n/2+3)
		handoff(t, m, topic, 2, "gs-txn-consumer", "consumer", n/3)
	})

	t.Run("compacted", func(t *testing.T) {
		const topic = "gs-compacted"
		if err := env.src.CreateTopic(ctx, topic, 1, 1, map[string]string{
			"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001", "min.compaction.lag.ms": "0",
		}); err != nil {
			t.Fatal(err)
		}
		var recs []*kgo.Record
		for i := 0; i < 400; i++ {
			recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(fmt.Sprint("key-", i%100)), Value: []byte(fmt.Sprint("v-", i))})
		}
		produceSync(t, sc, recs)
		time.Sleep(200 * time.Millisecond) // segment.ms passes: the next record rolls the segment
		produceSync(t, sc, []*kgo.Record{{Topic: topic, Key: []byte("last"), Value: []byte("rolls the segment")}})
		deadline := time.Now().Add(2 * time.Minute)
		for len(readAll(t, env.src, topic, 1, true)[0]) > 101 {
			if time.Now().After(deadline) {
				t.Fatal("the source's log cleaner did not compact the topic within 2 minutes")
			}
			time.Sleep(time.Second)
		}
		addCaughtUp(t, m, "gs", topic)
		handoff(t, m, topic, 1, "gs-compacted-consumer", "consumer", 37)
	})
}

// commitOn commits offsets for a group from outside its membership.
func commitOn(t *testing.T, cl *harness.Cluster, group, topic string, offsets map[int32]int64) {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Group, req.Generation = group, -1
	c := kgoClient(t, cl)
	rt := kmsg.NewOffsetCommitRequestTopic()
	// Both: OffsetCommit v10 (Kafka 4.2+) names topics by ID only.
	rt.Topic, rt.TopicID = topic, topicIDOf(t, c, topic)
	for p, o := range offsets {
		rp := kmsg.NewOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = p, o, -1
		rp.Metadata = kmsg.StringPtr(fmt.Sprintf("meta-%d", o))
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), c)
	if err != nil {
		t.Fatalf("commit offsets of %s on %s: %v", group, cl.Bootstrap(), err)
	}
	for _, tt := range resp.Topics {
		for _, p := range tt.Partitions {
			if p.ErrorCode != 0 {
				t.Fatalf("commit offsets of %s partition %d: error %d", group, p.Partition, p.ErrorCode)
			}
		}
	}
}

// topicIDOf returns topic's ID from a Metadata request.
func topicIDOf(t *testing.T, c *kgo.Client, topic string) [16]byte {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), c)
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	for _, mt := range resp.Topics {
		if mt.Topic != nil && *mt.Topic == topic && mt.ErrorCode == 0 {
			return mt.TopicID
		}
	}
	t.Fatalf("metadata has no topic %s", topic)
	return [16]byte{}
}

// waitGroupState waits until ListGroups shows group in state.
func waitGroupState(t *testing.T, cl *harness.Cluster, group, state string) {
	t.Helper()
	c := kgoClient(t, cl)
	deadline := time.Now().Add(time.Minute)
	for {
		got := ""
		for _, sh := range c.RequestSharded(context.Background(), kmsg.NewPtrListGroupsRequest()) {
			if sh.Err != nil {
				continue
			}
			for _, g := range sh.Resp.(*kmsg.ListGroupsResponse).Groups {
				if g.Group == group {
					got = g.GroupState
				}
			}
		}
		if got == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s is %q on %s, want %s", group, got, cl.Bootstrap(), state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitGroupRows waits until every row of group shows state with a reason
// containing reason.
func waitGroupRows(t *testing.T, m *member, mirror, group, state, reason string, n int) []api.GroupStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, err := m.client.DescribeGroups(context.Background(), mirror)
		if err != nil {
			t.Fatal(err)
		}
		var mine []api.GroupStatus
		for _, r := range rows {
			if r.Group == group && r.State == state && strings.Contains(r.Reason, reason) {
				mine = append(mine, r)
			}
		}
		if len(mine) == n {
			return mine
		}
		if time.Now().After(deadline) {
			t.Fatalf("group %s: want %d rows %s with %q, have %+v", group, n, state, reason, rows)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestGroupSyncConflicts: a group in use on the destination is never
// written and shows as a conflict until its consumers leave; a destination
// offset ahead of the source's is never moved back; excluded groups are
// not synced.
func TestGroupSyncConflicts(t *testing.T) {
	m := groupMember(t, "gs-conflicts")
	ctx := context.Background()
	const topic, other = "gs-conflict", "gs-conflict-other"
	for _, tp := range []string{topic, other} {
		if err := env.src.CreateTopic(ctx, tp, 2, 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.dst.CreateTopic(ctx, other, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 100))
	addCaughtUp(t, m, "gs", topic)

	// A KIP-848 consumer of another topic keeps group "gs-busy" in use on
	// the destination.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	busy := env.dst.Java(cctx, "org.apache.kafka.tools.consumer.ConsoleConsumer",
		consoleArgs(env.dst, other, "gs-busy", "consumer", 1000)...)
	var busyErr bytes.Buffer
	busy.Stderr = &busyErr
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	waitGroupState(t, env.dst, "gs-busy", "Stable")
	commitOn(t, env.src, "gs-busy", topic, map[int32]int64{0: 20, 1: 15})
	// The destination's commit first: a sync round between the two would
	// otherwise commit 10 there before the test's 40 (a race of the test).
	commitOn(t, env.dst, "gs-ahead", topic, map[int32]int64{0: 40})
	commitOn(t, env.src, "gs-ahead", topic, map[int32]int64{0: 10})
	commitOn(t, env.src, "ignored-group", topic, map[int32]int64{0: 5})

	rows := waitGroupRows(t, m, "gs", "gs-busy", api.GroupConflict, "has members on the destination", 2)
	if rows[0].DestinationCommitted != -1 || rows[1].DestinationCommitted != -1 {
		t.Fatalf("a group in use on the destination got offsets: %+v", rows)
	}
	if got := committedByTool(t, env.dst, "gs-busy", topic); len(got) != 0 {
		t.Fatalf("kafka-consumer-groups shows offsets %v of %s for the busy group on the destination", got, topic)
	}
	ahead := waitGroupRows(t, m, "gs", "gs-ahead", api.GroupConflict, "never moves a committed offset backwards", 1)
	if ahead[0].DestinationCommitted != 40 {
		t.Fatalf("gs-ahead row %+v: want destination committed 40 kept", ahead[0])
	}
	out, _, code := cli(t, m, "describe", "--groups", "--mirror", "gs")
	if code != 0 || !strings.Contains(out, "gs-busy") || !strings.Contains(out, "conflict") {
		t.Fatalf("kmirror describe --groups (exit %d):\n%s", code, out)
	}
	metrics := metricsText(t, m)
	for _, want := range []string{`kmirror_group_partitions{mirror="gs",state="conflict"} 3`, `kmirror_group_conflicts_total{mirror="gs"} 3`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}

	// The consumer leaves: the group is free and gets the source's offsets.
	busy.Process.Signal(syscall.SIGTERM)
	busy.Wait()
	want := waitGroupSynced(t, m, "gs", "gs-busy", topic, map[int32]int64{0: 20, 1: 15})
	if got := committedByTool(t, env.dst, "gs-busy", topic); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("destination offsets of gs-busy %v, want %v", got, want)
	}
	if got := committedByTool(t, env.dst, "gs-ahead", topic); got[0] != 40 {
		t.Fatalf("destination offset of gs-ahead moved back to %v", got)
	}
	all, err := m.client.DescribeGroups(ctx, "gs")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Group == "ignored-group" {
			t.Fatalf("excluded group synced: %+v", r)
		}
	}
	if got := committedByTool(t, env.dst, "ignored-group", topic); len(got) != 0 {
		t.Fatalf("excluded group has destination offsets %v", got)
	}

	// kmirror alter: excluding gs-ahead takes it out of the sync; another
	// cluster's bootstrap is refused.
	props := writeFile(t, "gs.properties", "bootstrap.servers="+env.src.Bootstrap()+"\ngroups.exclude=ignored-.*|gs-ahead\ngroups.sync.interval=300ms\n")
	if out, errOut, code := cli(t, m, "alter", "--mirror", "gs", "--mirror-config", props); code != 0 {
		t.Fatalf("kmirror alter: exit %d\n%s%s", code, out, errOut)
	}
	waitGroupRows(t, m, "gs", "gs-ahead", api.GroupConflict, "", 0)
	elsewhere := writeFile(t, "other.properties", "bootstrap.servers="+env.dst.Bootstrap()+"\n")
	_, errOut, code := cli(t, m, "alter", "--mirror", "gs", "--mirror-config", elsewhere)
	if code != 1 || !strings.Contains(errOut, "a mirror cannot move to another cluster") {
		t.Fatalf("alter to another cluster: exit %d, %q", code, errOut)
	}
}

// TestGroupSyncLag measures how long a source commit takes to reach the
// destination (printed for the closing note, not asserted).
func TestGroupSyncLag(t *testing.T) {
	m := groupMember(t, "gs-lag")
	ctx := context.Background()
	const topic = "gs-lag"
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0)), keyedRecords(topic, 0, 100))
	addCaughtUp(t, m, "gs", topic)
	dc := kgoClient(t, env.dst)
	var lags []time.Duration
	for i := 1; i <= 20; i++ {
		commitOn(t, env.src, "gs-lag-group", topic, map[int32]int64{0: int64(i * 5)})
		start := time.Now()
		for {
			req := kmsg.NewPtrOffsetFetchRequest()
			req.Group = "gs-lag-group"
			rt := kmsg.NewOffsetFetchRequestTopic()
			rt.Topic, rt.Partitions = topic, []int32{0}
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, dc)
			if err == nil && len(resp.Topics) == 1 && len(resp.Topics[0].Partitions) == 1 && resp.Topics[0].Partitions[0].Offset == int64(i*5) {
				// The consumer's metadata string is kept.
				if md := resp.Topics[0].Partitions[0].Metadata; md == nil || *md != fmt.Sprintf("meta-%d", i*5) {
					t.Fatalf("destination commit %d carries metadata %v, want the source's meta-%d", i*5, md, i*5)
				}
				break
			}
			if time.Since(start) > time.Minute {
				t.Fatalf("commit %d not on the destination within a minute (%v, %v)", i*5, resp, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		lags = append(lags, time.Since(start))
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	t.Logf("group sync lag over %d commits (groups.sync.interval=300ms): median %s, max %s",
		len(lags), lags[len(lags)/2].Round(time.Millisecond), lags[len(lags)-1].Round(time.Millisecond))
}
