package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestTranslationFloor: a transactional topic leaves a translation
// breakpoint at every commit marker and its log start never moves, so
// without a bound its translation grows for ever (issue 18). With
// translation_max_bytes at 1 KiB the member keeps only the newest
// segment: the records still compare equal one by one, offsets from the
// floor on translate exactly, offsets below it are refused with the
// reason (never guessed), a group committed below the floor is left
// pending with that reason while one above it is synced, and all of this
// holds after a kill -9 and restart (the floor is persisted with the
// checkpoint, or the restored translation would answer below it).
func TestTranslationFloor(t *testing.T) {
	ctx := context.Background()
	const topic, txns = "xl-floor", 1300 // 1,024 breakpoints seal a segment
	m := startMember(t, "xl-floor", memberOpts{extra: "translation_max_bytes: 1KiB\n"})
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "xf", Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "groups.sync.interval": "300ms"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.src.CreateTopic(ctx, topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	c, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(env.src.Bootstrap(), ",")...),
		kgo.TransactionalID("kmirror-it-xl-floor"), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	for i := 0; i < txns; i++ {
		if err := c.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(fmt.Sprintf("txn-%04d", i)),
			Headers: []kgo.RecordHeader{{Key: "h", Value: []byte{byte(i)}}}}
		if err := c.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d transactions in %v", txns, time.Since(began).Round(time.Millisecond))
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "xf", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, m, "xf", topic)
	src := readAll(t, env.src, topic, 1, true)
	requireSameRecords(t, src, readAll(t, env.dst, topic, 1, true))

	floor := int64(metricValue(t, m, `kmirror_partition_translation_floor{mirror="xf",partition="0",topic="xl-floor"} `))
	srcEnd := endOffsets(t, kgoClient(t, env.src), topic, 1, true)[0]
	if floor <= 0 || floor >= srcEnd {
		t.Fatalf("translation floor %d: want one inside the partition (0, %d): the bound dropped nothing", floor, srcEnd)
	}
	if b := metricValue(t, m, `kmirror_partition_translation_bytes{mirror="xf",partition="0",topic="xl-floor"} `); b <= 0 || b > 64<<10 {
		t.Fatalf("kmirror_partition_translation_bytes = %v: want the open segment only", b)
	}
	checkTranslations := func(when string) {
		t.Helper()
		dst := readAll(t, env.dst, topic, 1, true)[0]
		j := 0
		for o := int64(0); o <= srcEnd; o++ {
			for j < len(src[0]) && src[0][j].Offset < o {
				j++
			}
			got, err := m.client.Translate(ctx, "xf", topic, 0, o)
			if o < floor {
				if err == nil || !strings.Contains(err.Error(), "has no translation") || !strings.Contains(err.Error(), "translation_max_bytes") {
					t.Fatalf("%s: translate source offset %d below the floor %d: %+v, %v; want a refusal naming translation_max_bytes", when, o, floor, got, err)
				}
				continue
			}
			want := int64(len(dst))
			if j < len(dst) {
				want = dst[j].Offset
			}
			if err != nil || got.DestinationOffset != want {
				t.Fatalf("%s: translate source offset %d = %+v, %v; want %d", when, o, got, err, want)
			}
		}
	}
	checkTranslations("before the restart")

	commitOn(t, env.src, "xf-below", topic, map[int32]int64{0: floor / 2})
	commitOn(t, env.src, "xf-above", topic, map[int32]int64{0: floor + 1})
	waitGroupRows(t, m, "xf", "xf-below", api.GroupPending, "has no translation", 1)
	waitGroupSynced(t, m, "xf", "xf-above", topic, map[int32]int64{0: floor + 1})
	if got := committedOn(t, env.dst, "xf-below", topic); len(got) != 0 {
		t.Fatalf("group below the floor has destination offsets %v: kmirror guessed", got)
	}

	m.kill9()
	m.start()
	waitCaughtUp(t, m, "xf", topic)
	if got := int64(metricValue(t, m, `kmirror_partition_translation_floor{mirror="xf",partition="0",topic="xl-floor"} `)); got != floor {
		t.Fatalf("translation floor after the restart: %d, want %d", got, floor)
	}
	checkTranslations("after a kill -9 and restart")
}
