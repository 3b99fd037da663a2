package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	leaderpkg "github.com/kmirror/kmirror/daemon/leader"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestLateBatchAfterStopNamed is issue 19's scenario on a destination
// without an authorizer: the owner of some partitions reaches the
// destination through a link that stalls while it holds the owner's next
// produce request; the owner is killed -9; remove (through another
// member) records each partition's last mirrored position once the
// partitions are taken over; an application writes to the topic, now the
// writable copy; then the link delivers the held request and the broker
// appends kmirror's stale batch after the application's records. Nothing
// in stock Kafka without an authorizer refuses it; it must be found and
// named: describe's REASON, kmirror_partition_late_records_total, with
// exactly the records the destination holds past the recorded position
// that the application did not write.
func TestLateBatchAfterStopNamed(t *testing.T) {
	ctx := context.Background()
	dst, err := harness.Start(ctx, harness.Options{Name: "dest-late", Listeners: []string{"PROXIED"}, BrokerProps: brokerProps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	g := startGroupEach(t, "lb", 3, func(i int) memberOpts {
		if i == 2 {
			return memberOpts{destination: strings.Join(dst.ListenerAddrs("PROXIED"), ",")}
		}
		return memberOpts{destination: dst.Bootstrap()}
	})
	m, held := g.members[0], g.members[2]
	const topic, partitions = "late-after-stop", 6
	wait := mirrorStreams(t, m, "lb", []string{topic}, partitions, 20_000, 1_000)
	var heldParts []int32
	for end := time.Now().Add(time.Minute); len(heldParts) == 0; time.Sleep(200 * time.Millisecond) {
		rows, err := m.client.Describe(ctx, "lb", topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Owner == memberID(held) && r.State == "MIRRORING" && r.DestinationOffset > 0 {
				heldParts = append(heldParts, r.Partition)
			}
		}
		if time.Now().After(end) {
			t.Fatalf("%s mirrors none of the partitions within a minute: %+v", memberID(held), rows)
		}
	}
	link := dst.ListenerProxy(0)
	link.FreezeProduceRequests(topic, 1)
	for end := time.Now().Add(30 * time.Second); link.Held() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no produce request of the owner's reached the link within 30 s")
		}
	}
	link.Stall(true) // the link froze with the owner's next produce request in it
	// An emergency remove while the owner is cut off: the others stop
	// its partitions once they take them over, and write nothing more.
	removed := make(chan error, 1)
	go func() {
		// Retried as an operator would when the leader it went to is the
		// member killed.
		var err error
		for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(time.Second) {
			if err = m.client.RemoveTopic(ctx, "lb", topic); err == nil || !errors.Is(err, api.ErrNotLeader) {
				break
			}
		}
		removed <- err
	}()
	time.Sleep(500 * time.Millisecond)
	held.kill9()
	t.Logf("stalled %s's destination link with a produce request in it, removed the topic and killed %s (it mirrored partitions %v)",
		memberID(held), memberID(held), heldParts)
	if err := <-removed; err != nil {
		t.Fatal(err)
	}
	wait()
	rows, err := m.client.Describe(ctx, "lb", topic)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[int32]int64{}
	for _, r := range rows {
		if r.State != "STOPPED" {
			t.Fatalf("after remove: %+v", r)
		}
		recorded[r.Partition] = r.DestinationOffset
	}
	produceTo(t, dst, topic, partitions, 100*partitions, "app")
	link.Stall(false)
	if err := link.ReleaseHeld(); err != nil {
		t.Fatal(err)
	}

	// What the destination holds past each recorded position that the
	// application did not write: kmirror's late records.
	var late map[int32]int64
	// firstLate describes each partition's first late batch as the
	// destination holds it: the run of kmirror's records from the first
	// one, under one producer identity.
	var firstLate map[int32]string
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		late, firstLate = map[int32]int64{}, map[int32]string{}
		total := int64(0)
		for p, recs := range readAll(t, dst, topic, partitions, false) {
			var first, last *kgo.Record
			n := 0
			for _, r := range recs {
				if r.Offset >= recorded[int32(p)] && !strings.HasPrefix(string(r.Value), "app-") {
					late[int32(p)]++
					total++
					if first == nil {
						first = r
					}
					if first.ProducerID == r.ProducerID && first.ProducerEpoch == r.ProducerEpoch && (last == nil || r.Offset == last.Offset+1) {
						last = r
						n++
					}
				}
			}
			if first != nil {
				firstLate[int32(p)] = fmt.Sprintf("first: destination offsets %d..%d (%d records, producer ID %d epoch %d",
					first.Offset, last.Offset, n, first.ProducerID, first.ProducerEpoch)
			}
		}
		if total > 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no late batch landed: the scenario did not hold a produce request in the link (nothing was checked)")
		}
	}
	t.Logf("late records past the recorded positions: %v", late)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		rows, err := m.client.Describe(ctx, "lb", topic)
		if err != nil {
			t.Fatal(err)
		}
		named := 0
		for _, r := range rows {
			want := fmt.Sprintf("LATE BATCHES: %d records of kmirror's", late[r.Partition])
			if late[r.Partition] > 0 && strings.Contains(r.Reason, want) {
				// The batch named first is the one the destination holds.
				if !strings.Contains(r.Reason, firstLate[r.Partition]) {
					t.Fatalf("partition %d: describe names %q; the destination's first late batch is %q", r.Partition, r.Reason, firstLate[r.Partition])
				}
				named++
			}
			if late[r.Partition] == 0 && strings.Contains(r.Reason, "LATE BATCHES") {
				t.Fatalf("partition %d named late records it does not hold: %q", r.Partition, r.Reason)
			}
		}
		if named == len(late) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("describe names %d of the %d partitions with late records: %+v", named, len(late), rows)
		}
	}
	leader := g.byID(g.leaderID(m))
	for p, n := range late {
		metric := fmt.Sprintf(`kmirror_partition_late_records_total{mirror="lb",partition="%d",topic="%s"} %d`, p, topic, n)
		if text := metricsText(t, leader); !strings.Contains(text, metric) {
			t.Fatalf("the leader's /metrics lacks %s", metric)
		}
	}
	if logCount(t, leader, leaderpkg.LogLateBatch) < len(late) {
		t.Fatalf("the leader logged %d late batches, want at least one per partition (%d)", logCount(t, leader, leaderpkg.LogLateBatch), len(late))
	}
}
