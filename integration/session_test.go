package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TestFetchSessionProtocol pins the broker behaviour the fetch loops rely
// on (KIP-227), against a real broker: a full fetch opens a session; an
// incremental fetch that lists no partition still returns new data of the
// partitions the session holds, at the offset last sent; a forgotten
// partition returns nothing; a wrong epoch is refused with error 71.
func TestFetchSessionProtocol(t *testing.T) {
	ctx := context.Background()
	const topic = "fetch-session"
	if err := env.src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
		t.Fatal(err)
	}
	prod := kgoClient(t, env.src, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	produceSync(t, prod, []*kgo.Record{{Partition: 0, Value: []byte("p0-first")}})
	conn, err := kwire.Dial(ctx, env.src.BrokerAddrs()[0], "kmirror-it", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	part := func(p int32, off int64) kwire.FetchPartition {
		return kwire.FetchPartition{Topic: topic, Partition: p, Offset: off, LeaderEpoch: -1, MaxBytes: 1 << 20}
	}
	fetch := func(id, epoch int32, parts []kwire.FetchPartition, forget []kwire.TopicPartition) (*kwire.FetchResponse, error) {
		return conn.FetchSession(ctx, &kwire.FetchRequest{MaxWait: 200 * time.Millisecond, MinBytes: 1, MaxBytes: 1 << 20,
			ReadCommitted: true, SessionID: id, SessionEpoch: epoch, Partitions: parts, Forgotten: forget})
	}
	records := func(res *kwire.FetchResponse, p int32) int {
		n := 0
		for _, fp := range res.Partitions {
			if fp.Partition == p {
				bs, _, err := kwire.SplitBatches(fp.Records)
				if err != nil {
					t.Fatal(err)
				}
				for _, b := range bs {
					n += int(b.RecordCount())
				}
			}
		}
		return n
	}

	res, err := fetch(0, 0, []kwire.FetchPartition{part(0, 0), part(1, 0)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.SessionID
	if id == 0 || records(res, 0) != 1 {
		t.Fatalf("full fetch: session %d, %d records of partition 0", id, records(res, 0))
	}
	// Partition 0 moved on; partition 1 is idle and left out.
	if res, err = fetch(id, 1, []kwire.FetchPartition{part(0, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if records(res, 0)+records(res, 1) != 0 {
		t.Fatalf("incremental fetch with no new data returned records: %+v", res.Partitions)
	}
	produceSync(t, prod, []*kgo.Record{{Partition: 1, Value: []byte("p1-first")}})
	if res, err = fetch(id, 2, nil, nil); err != nil {
		t.Fatal(err)
	}
	if records(res, 1) != 1 {
		t.Fatalf("an idle session partition did not return its new record: %+v", res.Partitions)
	}
	// Forget partition 1: its new data no longer comes back.
	produceSync(t, prod, []*kgo.Record{{Partition: 1, Value: []byte("p1-second")}})
	if res, err = fetch(id, 3, []kwire.FetchPartition{part(1, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	if records(res, 1) != 1 {
		t.Fatalf("changed partition 1 to offset 1: got %d records", records(res, 1))
	}
	produceSync(t, prod, []*kgo.Record{{Partition: 1, Value: []byte("p1-third")}})
	if res, err = fetch(id, 4, nil, []kwire.TopicPartition{{Topic: topic, Partition: 1}}); err != nil {
		t.Fatal(err)
	}
	if records(res, 1) != 0 {
		t.Fatalf("a forgotten partition returned records: %+v", res.Partitions)
	}
	_, err = fetch(id, 42, nil, nil)
	var kerr *kwire.Error
	if !errors.As(err, &kerr) || kerr.Code != kwire.CodeInvalidFetchSessionEpoch {
		t.Fatalf("wrong epoch: got %v, want error %d", err, kwire.CodeInvalidFetchSessionEpoch)
	}
	// A reset (session.reset) keeps the ID and sends epoch 0: the broker
	// drops the old session and opens a new one, so resets never leave
	// sessions behind in its cache.
	if res, err = fetch(id, 0, []kwire.FetchPartition{part(0, 0)}, nil); err != nil {
		t.Fatal(err)
	}
	if res.SessionID == 0 || res.SessionID == id {
		t.Fatalf("full fetch naming session %d: new session %d", id, res.SessionID)
	}
	_, err = fetch(id, 5, nil, nil)
	if !errors.As(err, &kerr) || kerr.Code != kwire.CodeFetchSessionIDNotFound {
		t.Fatalf("the old session after a reset: got %v, want error %d (dropped)", err, kwire.CodeFetchSessionIDNotFound)
	}
}
