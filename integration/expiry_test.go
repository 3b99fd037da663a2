package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// backlogAge is how old the mirrored records' timestamps are: past the
// destination's producer.id.expiration.ms (1 day by default), so the
// destination broker drops kmirror's producer state while it copies them
// (at its next expiry check, every second in these tests, and when a
// restarted broker loads its producer snapshot) and cannot de-duplicate a
// resend.
const backlogAge = 48 * time.Hour

// TestOldBacklogDestinationKills kills the (single) destination broker
// with SIGKILL several times while kmirror copies records whose
// timestamps are two days old, and restarts it with its data. Batches
// appended but not acknowledged before a kill must not land twice: the
// destination equals the source record by record, and no partition
// diverges.
func TestOldBacklogDestinationKills(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "old-backlog-kills", 8
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	streamAged(t, env.src, topic, 40_000, 100_000, backlogAge)()
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "src", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	wait := streamAged(t, env.src, topic, 120_000, 8_000, backlogAge)
	for i := 0; i < 4; i++ {
		<-time.After(2500 * time.Millisecond)
		if err := env.dst.KillBroker(0); err != nil {
			t.Fatal(err)
		}
		<-time.After(500 * time.Millisecond)
		if err := env.dst.StartBroker(ctx, 0); err != nil {
			t.Fatal(err)
		}
		t.Logf("killed and restarted the destination broker (%d)", i+1)
	}
	wait()
	rows := waitCaughtUp(t, m, "src", topic)
	requireNoDuplicates(t, waitRetriesDone(t, m, "src", topic, rows))
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	requireConfirms(t, m, topic)
}

// waitRetriesDone describes the topic again until no partition shows a
// "retrying: ..." reason (a checkpoint write or produce that met a broker
// restart is retried at the next round), for at most 15 s, and returns
// the rows.
func waitRetriesDone(t *testing.T, m *member, mirror, topic string, rows []api.PartitionStatus) []api.PartitionStatus {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		retrying := false
		for _, r := range rows {
			retrying = retrying || strings.HasPrefix(r.Reason, "retrying: ")
		}
		if !retrying || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(200 * time.Millisecond)
		var err error
		if rows, err = m.client.Describe(context.Background(), mirror, topic); err != nil {
			t.Fatal(err)
		}
	}
}

// requireConfirms fails unless the member verified at least one produce to
// a topic named topic (or starting with it) whose outcome it could not know (the path these tests are about),
// and logs how many of those verifications found the batch had landed.
func requireConfirms(t *testing.T, m *member, topic string) {
	t.Helper()
	confirms, landed := countConfirms(t, m, topic)
	if confirms == 0 {
		t.Fatalf("no produce to %s had an unknown outcome: the test did not exercise the resend path", topic)
	}
	t.Logf("%d unknown produce outcomes of %s verified; in %d the batch had landed and was not resent", confirms, topic, landed)
}

// countConfirms counts the member log's verifications of unknown produce
// outcomes to topic (confirms), and of those the ones that found the batch
// had landed (landed).
func countConfirms(t *testing.T, m *member, topic string) (confirms, landed int) {
	t.Helper()
	b, err := os.ReadFile(m.logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "destination verified after the last acknowledged batch") && strings.Contains(line, ":"+topic) {
			confirms++
			if !strings.Contains(line, `"walked_records":0`) {
				landed++
			}
		}
	}
	return confirms, landed
}

// requireNoDuplicates fails when describe counted any duplicate record.
func requireNoDuplicates(t *testing.T, rows []api.PartitionStatus) {
	t.Helper()
	for _, r := range rows {
		if r.DuplicateRecords != 0 || r.Reason != "" {
			t.Fatalf("partition %s/%d: %d duplicate records, reason %q", r.Topic, r.Partition, r.DuplicateRecords, r.Reason)
		}
	}
}

// TestOldBacklogLostAnswers mirrors two-day-old records into a destination
// reached through a proxy (a harness test hook) that loses answers:
//
//   - lost responses: the proxy swallows produce answers after the broker
//     appended the batches, and kmirror learns of the failure only after
//     the broker's next producer-expiry check. The destination must equal
//     the source: kmirror verifies what landed instead of resending blind.
//   - a late request: the proxy holds kmirror's first produce request and
//     closes the connection; kmirror finds nothing landed and resends; the
//     held request is delivered after the broker forgot the producer and
//     lands a second time. kmirror must name it as its own duplicate (not
//     another producer), count it in describe and /metrics, and go on
//     mirroring with nothing lost.
func TestOldBacklogLostAnswers(t *testing.T) {
	ctx := context.Background()
	dst, err := harness.Start(ctx, harness.Options{Name: "destination-proxied", Proxy: true, BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	proxy := dst.Proxy(0)
	m := startMember(t, "lost", memberOpts{destination: dst.Bootstrap()})
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{
		Name: "psrc", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()},
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("lost responses", func(t *testing.T) {
		topics := map[string]int{"lost-one": 1, "lost-eight": 8}
		for topic, n := range topics {
			if err := env.src.CreateTopic(ctx, topic, n, 1, nil); err != nil {
				t.Fatal(err)
			}
			streamAged(t, env.src, topic, 20_000, 100_000, backlogAge)()
		}
		const drops = 4
		proxy.DropProduceResponses("lost-*", drops, 2500*time.Millisecond)
		if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "psrc", Topics: []string{"lost-one", "lost-eight"}}); err != nil {
			t.Fatal(err)
		}
		waits := []func(){streamAged(t, env.src, "lost-one", 20_000, 4_000, backlogAge),
			streamAged(t, env.src, "lost-eight", 20_000, 4_000, backlogAge)}
		for _, w := range waits {
			w()
		}
		rows := waitCaughtUp(t, m, "psrc", "lost-one", "lost-eight")
		if got := proxy.Dropped(); got != drops {
			t.Fatalf("the proxy swallowed %d produce answers, want %d", got, drops)
		}
		requireNoDuplicates(t, rows)
		for topic, n := range topics {
			requireSameRecords(t, readAll(t, env.src, topic, n, true), readAll(t, dst, topic, n, true))
		}
		requireConfirms(t, m, "lost-")
	})

	t.Run("late request", func(t *testing.T) {
		const topic = "late-one"
		if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
			t.Fatal(err)
		}
		dc, sc := kgoClient(t, dst), kgoClient(t, env.src)
		// want is what the destination must hold: every source record once,
		// in order, plus each named late copy where it landed.
		type span struct{ from, to int64 } // source offsets
		var want []span
		var mirroredTo int64 // source offset up to which want has the records
		srcEnd := func() int64 { return endOffsets(t, sc, topic, 1, true)[0] }
		// lateCopy holds kmirror's next produce to topic (the first batch of
		// what produce writes), lets kmirror find nothing landed and resend
		// it, waits until the destination broker has forgotten kmirror's
		// producer, delivers the held request, and runs then at once. It
		// returns where the copy landed and its record count.
		lateCopy := func(produce, then func()) (at, n int64) {
			t.Helper()
			from := srcEnd()
			proxy.HoldProduceRequests(topic, 1)
			produce()
			waitCaughtUp(t, m, "psrc", topic)
			if proxy.Held() != 1 {
				t.Fatalf("the proxy holds %d produce requests, want 1", proxy.Held())
			}
			waitNoProducerState(t, dc, topic)
			at = endOffsets(t, dc, topic, 1, false)[0]
			if err := proxy.ReleaseHeld(); err != nil {
				t.Fatal(err)
			}
			n = endOffsets(t, dc, topic, 1, false)[0] - at
			if n <= 0 {
				t.Fatalf("the late request did not land (destination end %d)", at)
			}
			t.Logf("the late request landed %d records a second time at destination offset %d", n, at)
			end := srcEnd()
			want = append(want, span{mirroredTo, end}, span{from, from + n})
			mirroredTo = end
			then()
			return at, n
		}
		nothing := func() {}

		// A copy after the backlog, on a partition that then stays idle:
		// found without another batch being sent, named and counted.
		at1, n1 := lateCopy(func() {
			streamAged(t, env.src, topic, 1000, 100_000, backlogAge)()
			if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "psrc", Topics: []string{topic}}); err != nil {
				t.Fatal(err)
			}
		}, nothing)
		row := waitDuplicates(t, m, "psrc", topic, n1)
		if !strings.Contains(row.Reason, "repeat an earlier batch of kmirror's own producer") ||
			!strings.Contains(row.Reason, fmt.Sprintf("destination offsets %d..%d", at1, at1+n1-1)) {
			t.Fatalf("describe does not name the duplicate: %q", row.Reason)
		}
		metric := fmt.Sprintf(`kmirror_partition_duplicate_records_total{mirror="psrc",partition="0",topic="%s"} %d`, topic, n1)
		if text := metricsText(t, m); !strings.Contains(text, metric) {
			t.Fatalf("/metrics lacks %s", metric)
		}

		// A copy followed at once by the next batch, while the broker holds
		// the state the copy made: that batch is refused as out of order,
		// kmirror renews its producer identity, and the copy, written with
		// the identity it had before, is still known as its own.
		_, n2 := lateCopy(func() {
			streamAged(t, env.src, topic, 100, 100_000, backlogAge)()
			waitCaughtUp(t, m, "psrc", topic)
			// A batch after the resent one, so that the copy's sequence lies
			// behind the one kmirror continues with.
			streamAged(t, env.src, topic, 20, 100_000, backlogAge)()
		}, func() { streamAged(t, env.src, topic, 10, 100_000, backlogAge)() })
		waitDuplicates(t, m, "psrc", topic, n1+n2)
		waitCaughtUp(t, m, "psrc", topic)

		// A copy landing just before remove: the recorded last mirrored
		// position is past it, so a consumer failing over there reads no
		// record twice.
		at3, n3 := lateCopy(func() { streamAged(t, env.src, topic, 50, 100_000, backlogAge)() }, nothing)
		if err := m.client.RemoveTopic(ctx, "psrc", topic); err != nil {
			t.Fatal(err)
		}
		end := srcEnd()
		rows, err := m.client.Describe(ctx, "psrc", topic)
		if err != nil {
			t.Fatal(err)
		}
		if r := rows[0]; r.State != "STOPPED" || r.SourceOffset != end || r.DestinationOffset != at3+n3 {
			t.Fatalf("last mirrored position %d -> %d (%s), want %d -> %d: the late copy at %d..%d was taken for mirrored data",
				r.SourceOffset, r.DestinationOffset, r.State, end, at3+n3, at3, at3+n3-1)
		}

		src := readAll(t, env.src, topic, 1, true)[0]
		var expect []*kgo.Record
		for _, sp := range want {
			expect = append(expect, src[sp.from:sp.to]...)
		}
		expect = append(expect, src[mirroredTo:]...)
		requireSameRecords(t, [][]*kgo.Record{expect}, readAll(t, dst, topic, 1, true))
	})
}

// waitDuplicates polls describe until the partition 0 of topic counts n
// duplicate records, and returns its row.
func waitDuplicates(t *testing.T, m *member, mirror, topic string, n int64) api.PartitionStatus {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; <-time.After(200 * time.Millisecond) {
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		if err != nil {
			t.Fatal(err)
		}
		if rows[0].DuplicateRecords == n {
			return rows[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("describe counts %d duplicate records of %s after a minute, want %d: %+v", rows[0].DuplicateRecords, topic, n, rows[0])
		}
	}
}

// waitNoProducerState polls DescribeProducers until partition 0 of topic
// has no active producer: the broker has dropped kmirror's state.
func waitNoProducerState(t *testing.T, c *kgo.Client, topic string) {
	t.Helper()
	req := kmsg.NewPtrDescribeProducersRequest()
	rt := kmsg.NewDescribeProducersRequestTopic()
	rt.Topic, rt.Partitions = topic, []int32{0}
	req.Topics = append(req.Topics, rt)
	for deadline := time.Now().Add(time.Minute); ; <-time.After(200 * time.Millisecond) {
		active := -1
		for _, sh := range c.RequestSharded(context.Background(), req) {
			if sh.Err != nil {
				t.Fatalf("describe producers of %s: %v", topic, sh.Err)
			}
			for _, tt := range sh.Resp.(*kmsg.DescribeProducersResponse).Topics {
				for _, p := range tt.Partitions {
					if p.ErrorCode != 0 {
						t.Fatalf("describe producers of %s/%d: error %d", topic, p.Partition, p.ErrorCode)
					}
					active = len(p.ActiveProducers)
				}
			}
		}
		if active == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the destination still keeps %d producers' state for %s after a minute", active, topic)
		}
	}
}
