package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/owner"
)

// Issue 16: the source deletes records kmirror copied after its last
// checkpoint, then the partition is resumed by a walk (kill -9, a pause past
// the lease, a takeover). Those records must be accepted as mirrored, never
// reported as a source gap.

const realignedMsg = "the source deleted records past the checkpoint; walking on"

// produceBatches produces n keyed records from `from` in batches of size
// records each (one ProduceSync per batch, so one source batch each).
func produceBatches(t *testing.T, c *kgo.Client, topic string, from, n, size int) {
	t.Helper()
	for i := from; i < from+n; i += size {
		produceSync(t, c, keyedRecords(topic, i, min(size, from+n-i)))
	}
}

// produceCommitted produces txns transactions of size records each, all
// committed, so every size records are followed by a commit marker.
func produceCommitted(t *testing.T, topic string, from, txns, size int) {
	t.Helper()
	ctx := context.Background()
	tc := kgoClient(t, env.src, kgo.TransactionalID(topic+"-txn"))
	for i := 0; i < txns; i++ {
		if err := tc.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, r := range keyedRecords(topic, from+i*size, size) {
			tc.Produce(ctx, r, nil)
		}
		if err := tc.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := tc.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	want := int64(txns * (size + 1))
	deadline := time.Now().Add(30 * time.Second)
	for endOffsets(t, kgoClient(t, env.src), topic, 1, true)[0] < want {
		if time.Now().After(deadline) {
			t.Fatalf("the source's last stable offset of %s never reached %d", topic, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireTranslation requires translate(o) == want(o) for source offsets
// from..to.
func requireTranslation(t *testing.T, m *member, mirror, topic string, from, to int64, want func(int64) int64) {
	t.Helper()
	for o := from; o <= to; o++ {
		tr, err := m.client.Translate(context.Background(), mirror, topic, 0, o)
		if err != nil || tr.DestinationOffset != want(o) {
			t.Fatalf("translate(%s/0 offset %d) = %+v, %v; want %d", topic, o, tr, err, want(o))
		}
	}
}

// deletedAfterMirror sets up the smallest input on topic: 150
// records in three batches, mirrored; then the source deletes offsets
// 0..119 (inside the last batch, as DeleteRecords may). It returns the
// records as they were before the deletion.
func deletedAfterMirror(t *testing.T, m *member, mirror, topic string) []*kgo.Record {
	t.Helper()
	if err := env.src.CreateTopic(context.Background(), topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceBatches(t, kgoClient(t, env.src), topic, 0, 150, 50)
	addCaughtUp(t, m, mirror, topic)
	before := readAll(t, env.src, topic, 1, true)[0]
	deleteRecords(t, env.src, topic, 0, 120)
	return before
}

// requireMirroredOn checks topic after the resume: MIRRORING, 10 more
// records mirrored, the destination equal record by record to every
// record the source ever held, translation exact at every offset still on
// both sides.
func requireMirroredOn(t *testing.T, m *member, mirror, topic string, before []*kgo.Record) {
	t.Helper()
	rows := waitCaughtUp(t, m, mirror, topic)
	if r := rows[0]; r.SourceOffset != 150 || r.DestinationOffset != 150 || r.Reason != "" {
		t.Fatalf("after the resume: %+v; want MIRRORING at 150/150, no reason", r)
	}
	produceSync(t, kgoClient(t, env.src), keyedRecords(topic, 150, 10))
	rows = waitCaughtUp(t, m, mirror, topic)
	if r := rows[0]; r.DestinationOffset != 160 || r.SkippedRecords != 0 || r.LastGap != "" || r.Reason != "" {
		t.Fatalf("after 10 more: %+v; want 160 with nothing skipped", r)
	}
	src := readAll(t, env.src, topic, 1, true)[0]
	if len(src) != 40 || src[0].Offset != 120 {
		t.Fatalf("source holds %d records from offset %d, want 40 from 120", len(src), src[0].Offset)
	}
	requireSameRecords(t, [][]*kgo.Record{append(before, src[30:]...)}, readAll(t, env.dst, topic, 1, true))
	requireTranslation(t, m, mirror, topic, 0, 160, func(o int64) int64 { return o })
}

// TestSourceDeletedAfterMirrorKill: one member, checkpoints an hour apart
// (the kill always lands before one). A plain topic and a transactional
// one (commit markers among the deleted offsets, so the copies sit below
// where a linear mapping would put them); kill -9 and restart: both
// MIRRORING, equal, translation exact; remove records the true last
// mirrored position and a failback from it continues without a copy.
func TestSourceDeletedAfterMirrorKill(t *testing.T) {
	ctx := context.Background()
	m := startMirrorMember(t, "sd-kill", memberOpts{checkpoint: "1h"}, "sdkill", env.src)
	const topic, txnTopic = "sd-kill", "sd-kill-txn"
	before := deletedAfterMirror(t, m, "sdkill", topic)

	// Five committed transactions of 20: offsets 21i..21i+19, marker at
	// 21i+20. The source deletes 0..69, inside the fourth transaction
	// (offsets 63..82), whose copy starts at destination offset 60.
	if err := env.src.CreateTopic(ctx, txnTopic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceCommitted(t, txnTopic, 0, 5, 20)
	addCaughtUp(t, m, "sdkill", txnTopic)
	txnBefore := readAll(t, env.src, txnTopic, 1, true)[0]
	deleteRecords(t, env.src, txnTopic, 0, 70)

	m.kill9()
	m.start()
	requireMirroredOn(t, m, "sdkill", topic, before)

	rows := waitCaughtUp(t, m, "sdkill", txnTopic)
	if r := rows[0]; r.SourceOffset != 105 || r.DestinationOffset != 100 {
		t.Fatalf("transactional topic after the resume: %+v; want 105/100", r)
	}
	requireSameRecords(t, [][]*kgo.Record{txnBefore}, readAll(t, env.dst, txnTopic, 1, true))
	// Source offset o of transaction i (o = 21i+j) is destination 20i+j;
	// a marker translates to the next transaction's first record.
	requireTranslation(t, m, "sdkill", txnTopic, 70, 105, func(o int64) int64 {
		i, j := o/21, o%21
		return 20*i + min(j, 20)
	})
	if n := logCount(t, m, realignedMsg); n < 2 {
		t.Fatalf("%d realigned walks logged, want one per topic", n)
	}

	// Failover, then failback B->A from the recorded position.
	if err := m.client.RemoveTopic(ctx, "sdkill", topic); err != nil {
		t.Fatal(err)
	}
	if got := stoppedAt(t, m, "sdkill", topic, 1, true); got[0] != 160 {
		t.Fatalf("remove recorded destination offset %d, want 160 (every record mirrored)", got[0])
	}
	if got := stateRecords(t, env.dst, topic); got[0].SourceOffset != 160 || got[0].DestinationOffset != 160 {
		t.Fatalf("__kmirror_state holds %+v, want 160/160", got[0])
	}
	produceTo(t, env.dst, topic, 1, 20, "b")
	mA := sideMember(t, "sd-kill-back", env.src, env.dst, "sdback")
	out, errOut, code := cli(t, mA, "add", "--mirror", "sdback", "--topic", topic, "--dry-run")
	if code != 0 || !strings.Contains(out, "failback from mirror sdkill: continue") {
		t.Fatalf("add --dry-run of the failback: exit %d\n%s%s", code, out, errOut)
	}
	addCaughtUp(t, mA, "sdback", topic)
	a, b := readAll(t, env.src, topic, 1, true)[0], readAll(t, env.dst, topic, 1, true)[0]
	if len(b) != 180 || len(a) != 60 || a[0].Offset != 120 {
		t.Fatalf("after the failback A holds %d records from %d, B %d; want 60 from 120 and 180", len(a), a[0].Offset, len(b))
	}
	requireSameRecords(t, [][]*kgo.Record{b[120:]}, [][]*kgo.Record{a})
}

// TestSourceDeletedAfterMirrorPause: the same with no crash: the member is
// frozen (SIGSTOP) past lease_ttl, notices it lost its lease when it wakes
// and resumes its partitions with a walk.
func TestSourceDeletedAfterMirrorPause(t *testing.T) {
	m := startMirrorMember(t, "sd-pause", memberOpts{checkpoint: "1h", extra: groupLease}, "sdpause", env.src)
	const topic = "sd-pause"
	before := deletedAfterMirror(t, m, "sdpause", topic)
	m.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(8 * time.Second) // past lease_ttl (6s): the pause itself is the fault
	m.cmd.Process.Signal(syscall.SIGCONT)
	const lost = owner.LogLeaseLost
	deadline := time.Now().Add(30 * time.Second)
	for logCount(t, m, lost) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the member never noticed its pause:\n%s", m.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	requireMirroredOn(t, m, "sdpause", topic, before)
	if logCount(t, m, realignedMsg) == 0 {
		t.Fatal("the walk after the pause did not realign on the source's surviving records")
	}
}

// TestSourceDeletedAfterMirrorTakeover: three members; the owner of the
// partition is killed after the source deleted records it mirrored, and
// the member that takes it over walks from the last checkpoint.
func TestSourceDeletedAfterMirrorTakeover(t *testing.T) {
	g := startGroupWith(t, "sdt", 3, memberOpts{checkpoint: "1h"})
	m0 := g.members[0]
	if err := m0.client.CreateMirror(context.Background(), api.CreateMirrorRequest{
		Name: "sdt", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic = "sd-takeover"
	before := deletedAfterMirror(t, m0, "sdt", topic)
	owner := g.byID(owners(t, m0, "sdt")[topic+"/0"])
	var watcher *member
	for _, m := range g.members {
		if m != owner {
			watcher = m
		}
	}
	owner.kill9()
	t.Logf("killed %s, the owner; took over in %s", memberID(owner), waitTakenOver(t, watcher, "sdt", memberID(owner)))
	requireMirroredOn(t, watcher, "sdt", topic, before)
}

// TestSourceGapAfterUncheckpointedCopies: kmirror copied 0..99 past its
// checkpoint and was killed; 100..149 were written and deleted while it
// was down, so they are a real gap. DIVERGED names exactly that gap and
// keeps kmirror's copies; resume --accept-gap skips it once, counts it,
// and mirrors on with an exact translation.
func TestSourceGapAfterUncheckpointedCopies(t *testing.T) {
	m := startMirrorMember(t, "sd-gap", memberOpts{checkpoint: "1h"}, "sdgap", env.src)
	const topic = "sd-gap"
	if err := env.src.CreateTopic(context.Background(), topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	sc := kgoClient(t, env.src)
	produceBatches(t, sc, topic, 0, 100, 50)
	addCaughtUp(t, m, "sdgap", topic)
	before := readAll(t, env.src, topic, 1, true)[0]
	m.kill9()
	produceBatches(t, sc, topic, 100, 50, 50)
	deleteRecords(t, env.src, topic, 0, 150)
	produceSync(t, sc, keyedRecords(topic, 150, 10))
	m.start()

	r := waitAllStates(t, m, "sdgap", topic, "DIVERGED", "source offsets 100..149", time.Minute)[0]
	for _, want := range []string{"the source log starts at 150", "--accept-gap", "kmirror's copies on the destination (offsets 0..99, written after its last checkpoint) stand for 100 of them", "counting at most 50 records"} {
		if !strings.Contains(r.Reason, want) {
			t.Fatalf("reason %q lacks %q", r.Reason, want)
		}
	}
	if out, stderr, code := cli(t, m, "resume", "--mirror", "sdgap", "--topic", topic, "--accept-gap"); code != 0 {
		t.Fatalf("kmirror resume --accept-gap: exit %d, %q %q", code, out, stderr)
	}
	rows := waitCaughtUp(t, m, "sdgap", topic)
	if rows[0].SkippedRecords != 50 || rows[0].LastGap != "100..149" || rows[0].DestinationOffset != 110 {
		t.Fatalf("describe after accepting the gap: %+v; want 50 skipped, gap 100..149, destination at 110", rows[0])
	}
	after := readAll(t, env.src, topic, 1, true)[0]
	requireSameRecords(t, [][]*kgo.Record{append(before, after...)}, readAll(t, env.dst, topic, 1, true))
	for _, c := range []struct{ src, dst int64 }{{99, 99}, {100, 100}, {149, 100}, {150, 100}, {155, 105}, {160, 110}} {
		tr, err := m.client.Translate(context.Background(), "sdgap", topic, 0, c.src)
		if err != nil || tr.DestinationOffset != c.dst {
			t.Fatalf("translate(%d) = %+v, %v; want %d", c.src, tr, err, c.dst)
		}
	}
	// The resume past the gap is checkpointed at once: a kill -9 right
	// after it, with nothing new to mirror, neither meets the gap again
	// nor counts it twice.
	m.kill9()
	m.start()
	rows = waitCaughtUp(t, m, "sdgap", topic)
	if rows[0].SkippedRecords != 50 || rows[0].DestinationOffset != 110 {
		t.Fatalf("after a kill -9 past the accepted gap: %+v; want MIRRORING at 110 with 50 skipped", rows[0])
	}
}

// sizedStream produces 1 KiB records to each topic at about rate bytes/s
// per topic until stop is called, and returns every acknowledged record
// per topic in offset order.
func sizedStream(t *testing.T, topics []string, rate int) (stop func() map[string][]*kgo.Record) {
	t.Helper()
	c := kgoClient(t, env.src, kgo.ProducerLinger(5*time.Millisecond), kgo.ProducerBatchCompression(kgo.NoCompression()))
	var mu sync.Mutex
	var firstErr error
	acked := map[string][]*kgo.Record{}
	done := make(chan struct{})
	finished := make(chan struct{})
	pad := strings.Repeat("x", 1000)
	go func() {
		defer close(finished)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		perTick := max(1, rate/1024/100)
		for i := 0; ; {
			select {
			case <-done:
				if err := c.Flush(ctx); err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
				return
			case <-tick.C:
			}
			for range perTick {
				for _, topic := range topics {
					r := &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i%1000), Value: fmt.Appendf(nil, "%09d%s", i, pad)}
					c.Produce(ctx, r, func(r *kgo.Record, err error) {
						mu.Lock()
						defer mu.Unlock()
						if err != nil && firstErr == nil {
							firstErr = err
						}
						if err == nil {
							acked[r.Topic] = append(acked[r.Topic], r)
						}
					})
				}
				i++
			}
		}
	}()
	return func() map[string][]*kgo.Record {
		close(done)
		select {
		case <-finished:
		case <-time.After(2 * time.Minute):
			t.Fatal("the producer did not flush within 2 minutes")
		}
		mu.Lock()
		defer mu.Unlock()
		if firstErr != nil {
			t.Fatal(firstErr)
		}
		for _, recs := range acked {
			sort.Slice(recs, func(i, j int) bool { return recs[i].Offset < recs[j].Offset })
		}
		return acked
	}
}

// TestSourceRetentionKills: size retention on the source (6 MiB kept, 1
// MiB segments) while 1.5 MB/s flows into each of two topics, checkpoints
// 30 s apart so the source deletes records past the checkpoint, and ten
// kill -9s of the member at random moments. Never DIVERGED. sd-ret-src
// has no retention on the destination: it must hold every record ever
// produced, once and in order. sd-ret-both keeps the source's retention on
// the destination too: the records both sides still hold are equal.
func TestSourceRetentionKills(t *testing.T) {
	ctx := context.Background()
	m := startMirrorMember(t, "sd-ret", memberOpts{checkpoint: "30s"}, "sdret", env.src)
	// sd-ret-src's destination keeps every record (retention.bytes -1, set
	// below): the config sync must leave that config alone.
	if err := m.client.AlterMirror(ctx, api.CreateMirrorRequest{Name: "sdret", Properties: map[string]string{
		"bootstrap.servers": env.src.Bootstrap(), "topics.config.exclude": "retention.bytes"}}); err != nil {
		t.Fatal(err)
	}
	topics := []string{"sd-ret-src", "sd-ret-both"}
	retention := map[string]string{"segment.bytes": "1048576", "retention.bytes": "6291456"}
	for _, topic := range topics {
		if err := env.src.CreateTopic(ctx, topic, 1, 1, retention); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "sdret", Topics: topics}); err != nil {
		t.Fatal(err)
	}
	alterTopicConfig(t, env.dst, "sd-ret-src", "retention.bytes", "-1")
	stop := sizedStream(t, topics, 1_500_000)
	seed := rand.Uint64()
	t.Logf("kill schedule seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 0))
	const kills = 10
	for i := range kills {
		time.Sleep(time.Duration(4000+rnd.IntN(3000)) * time.Millisecond)
		m.kill9()
		m.start()
		rows, err := m.client.Describe(ctx, "sdret", "")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.State == "DIVERGED" {
				t.Fatalf("after kill %d: %s/%d DIVERGED: %s", i+1, r.Topic, r.Partition, r.Reason)
			}
		}
	}
	acked := stop()
	waitCaughtUp(t, m, "sdret", topics...)
	realigned := logCount(t, m, realignedMsg)
	t.Logf("%d kill -9s, %d walks realigned after source deletions; %d and %d records produced", kills, realigned, len(acked[topics[0]]), len(acked[topics[1]]))
	if realigned == 0 {
		t.Fatalf("no walk met records the source deleted past the checkpoint: the test did not exercise the case")
	}
	requireSameRecords(t, [][]*kgo.Record{acked["sd-ret-src"]}, readAll(t, env.dst, "sd-ret-src", 1, true))
	src, dst := readAll(t, env.src, "sd-ret-both", 1, true)[0], readAll(t, env.dst, "sd-ret-both", 1, true)[0]
	if len(src) == 0 || len(dst) == 0 || src[len(src)-1].Offset != dst[len(dst)-1].Offset {
		t.Fatalf("sd-ret-both: source holds %d records, destination %d, last offsets differ", len(src), len(dst))
	}
	// No gap and no marker: destination offsets equal source offsets.
	// Compare what both still hold.
	from := max(src[0].Offset, dst[0].Offset)
	requireSameRecords(t, [][]*kgo.Record{src[from-src[0].Offset:]}, [][]*kgo.Record{dst[from-dst[0].Offset:]})
	for i, r := range dst {
		if r.Offset != dst[0].Offset+int64(i) {
			t.Fatalf("sd-ret-both: destination offset %d at position %d: a hole", r.Offset, i)
		}
	}
}
