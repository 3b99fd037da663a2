package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestVerify (issue 22, section 4): kmirror verify compares a mirrored
// topic with its source record by record through the translation (an
// aborted transaction on the source shifts the destination offsets): a
// clean copy verifies in full and sampled mode with exit 0, every
// committed record counted; records deleted on the destination behind
// kmirror's back (DeleteRecords: the data path only appends, so it cannot
// notice) are found by both modes, named with their offsets, exit 1.
func TestVerify(t *testing.T) {
	m := sharedMirror(t)
	ctx := context.Background()
	const topic, partitions = "vf", 2
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 0, 200))
	produceTransactions(t, env.src, topic, 1000, 50, kgo.TryAbort, kgo.TryCommit)
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 2000, 100))
	addCaughtUp(t, m, "src", topic)
	src := readAll(t, env.src, topic, partitions, true)
	requireSameRecords(t, src, readAll(t, env.dst, topic, partitions, true))

	verify := func(args ...string) ([]api.VerifyPartition, int, string) {
		t.Helper()
		out, errOut, code := cli(t, m, append([]string{"--output", "json", "verify", "--mirror", "src", "--topic", topic}, args...)...)
		var rows []api.VerifyPartition
		if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != partitions {
			t.Fatalf("verify %v: exit %d, not a report of %d partitions: %v\n%s%s", args, code, partitions, err, out, errOut)
		}
		return rows, code, out + errOut
	}
	rows, code, text := verify("--full")
	for _, r := range rows {
		if code != 0 || r.Mismatch != "" || r.Skipped != "" || r.Compared != int64(len(src[r.Partition])) {
			t.Fatalf("verify --full of a clean copy: exit %d, partition %d compared %d of its %d records\n%s", code, r.Partition, r.Compared, len(src[r.Partition]), text)
		}
	}
	if rows, code, text = verify("--samples", "20"); code != 0 || rows[0].Compared != 20 || rows[1].Compared != 20 {
		t.Fatalf("sampled verify of a clean copy: exit %d, want 20 records compared per partition\n%s", code, text)
	}

	// Behind kmirror's back: the destination's first 10 records of
	// partition 0 deleted.
	deleteRecords(t, env.dst, topic, 0, 10)
	for _, mode := range [][]string{{"--full"}, {"--samples", "5"}} {
		rows, code, text = verify(mode...)
		if code != 1 || !strings.Contains(rows[0].Mismatch, "the destination's log starts at 10") || rows[0].MismatchDestination != 0 ||
			rows[1].Mismatch != "" {
			t.Fatalf("verify %v after records deleted on the destination: exit %d, want 1 with partition 0's mismatch at destination offset 0\n%s",
				mode, code, text)
		}
	}
}
