package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestBackgroundVerify (issue 22, section 4): with verify.mode=full the
// owner compares every mirrored record of each partition with its source
// through the translation (an aborted transaction shifts the destination
// offsets) and describe shows it verified up to the mirrored position;
// with verify.mode=sampled it compares random mirrored records. Records
// deleted on the destination behind kmirror's back (DeleteRecords; a
// destination retention that rolled its segments earlier looks the same)
// are found by both modes and noted with the offsets, not compared, and
// the partitions keep mirroring.
func TestBackgroundVerify(t *testing.T) {
	m := startMember(t, "bgverify", memberOpts{})
	ctx := context.Background()
	const partitions = 2
	topics := map[string]string{"bgvf": "bgv-full", "bgvs": "bgv-sampled"}
	for mirror, mode := range map[string]string{"bgvf": "full", "bgvs": "sampled"} {
		props := map[string]string{"bootstrap.servers": env.src.Bootstrap(), "verify.mode": mode, "verify.records.per.sec": "100000"}
		if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: mirror, Properties: props}); err != nil {
			t.Fatal(err)
		}
		topic := topics[mirror]
		if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
			t.Fatal(err)
		}
		produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 200))
		produceTransactions(t, env.src, topic, 1000, 20, kgo.TryAbort, kgo.TryCommit)
		produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 2000, 100))
		addCaughtUp(t, m, mirror, topic)
	}
	committed := readAll(t, env.src, "bgv-full", partitions, true)

	// Full: a pass over every mirrored record.
	rows := waitRows(t, m, "bgvf", "bgv-full", "a full pass over every partition", func(p api.PartitionStatus) bool {
		return p.VerifiedUpTo == p.SourceOffset && p.VerifiedRecords >= int64(len(committed[p.Partition]))
	})
	for _, p := range rows {
		if !strings.Contains(p.Reason, "verified up to source offset") {
			t.Errorf("describe of partition %d does not say how far it is verified: %q", p.Partition, p.Reason)
		}
	}
	// Sampled: random records compared.
	waitRows(t, m, "bgvs", "bgv-sampled", "sampled records", func(p api.PartitionStatus) bool { return p.VerifiedRecords > 0 })
	if got := sumMetric(t, metricsText(t, m), "kmirror_partition_verified_records_total"); got < 300 {
		t.Errorf("kmirror_partition_verified_records_total sums to %v, want at least the %d records of a full pass", got, 300)
	}

	// Records deleted on the destination behind kmirror's back (or by a
	// retention that rolled differently): not compared, noted, never a
	// DIVERGED partition; the pass goes on from the first copy kept.
	for mirror, topic := range topics {
		deleteRecords(t, env.dst, topic, 0, 10)
		rows := waitRows(t, m, mirror, topic, "a note of the deleted copies", func(p api.PartitionStatus) bool {
			return p.Partition != 0 || strings.Contains(p.VerifyNote, "the destination's log starts at 10")
		})
		for _, p := range rows {
			if p.State != "MIRRORING" || p.VerifyMismatch != "" {
				t.Fatalf("%s: partition %d is %s with mismatch %q after records were deleted on the destination; want MIRRORING and a note",
					topic, p.Partition, p.State, p.VerifyMismatch)
			}
		}
		if !strings.Contains(rows[0].Reason, "is gone") {
			t.Errorf("%s: describe's reason of partition 0 does not name the deleted copies: %q", topic, rows[0].Reason)
		}
	}
	waitRows(t, m, "bgvf", "bgv-full", "a full pass after the deleted copies", func(p api.PartitionStatus) bool { return p.VerifiedUpTo == p.SourceOffset })
}

// waitRows waits until every partition row of topic satisfies ok.
func waitRows(t *testing.T, m *member, mirror, topic, what string, ok func(api.PartitionStatus) bool) []api.PartitionStatus {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		all := err == nil && len(rows) > 0
		for _, p := range rows {
			all = all && ok(p)
		}
		if all {
			return rows
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within 60s: %+v (%v)", topic, what, rows, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
