package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/integration/harness"
)

// TestDestinationQuota: a producer byte-rate quota on the destination for
// kmirror's client.id throttles its produce (throttle_time_ms, KIP-219):
// kmirror waits the throttle out instead of sending into the muted
// connection, every record arrives once (compared record by record), no
// produce ends with an unknown outcome, and /metrics counts the throttle
// time (issue 18).
func TestDestinationQuota(t *testing.T) {
	const clientID = "kmirror-quota-test"
	setProducerQuota(t, env.dst, clientID, "100000") // bytes/s
	t.Cleanup(func() { setProducerQuota(t, env.dst, clientID, "") })
	m := startMember(t, "quota", memberOpts{destExtra: "  client_id: " + clientID + "\n"})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "dq", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions = "dq-topic", 2
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range 1500 { // 1.5 MiB that does not compress: about 15 s at the quota
		value := make([]byte, 1024)
		rand.Read(value)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(strconv.Itoa(i)), Value: value})
	}
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner())), recs)
	addCaughtUp(t, m, "dq", topic)
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	throttled := 0.0
	re := regexp.MustCompile(`(?m)^kmirror_destination_throttle_seconds_total\{broker="[^"]+"\} ([0-9.e+-]+)$`)
	for _, mm := range re.FindAllStringSubmatch(metricsText(t, m), -1) {
		v, _ := strconv.ParseFloat(mm[1], 64)
		throttled += v
	}
	if throttled <= 0 {
		t.Fatalf("kmirror_destination_throttle_seconds_total is %v after copying 1.5 MiB through a 100 kB/s quota: the throttle was not seen\n%s", throttled, metricsText(t, m))
	}
	if log := m.logTail(); strings.Contains(log, "produce outcome unknown") {
		t.Fatalf("a throttled produce ended with an unknown outcome:\n%s", log)
	}
	t.Logf("throttled for %.1f s in all", throttled)
}

// setProducerQuota sets (or with "" removes) a producer_byte_rate client
// quota for client.id on cl, as kafka-configs --alter --entity-type
// clients does.
func setProducerQuota(t *testing.T, cl *harness.Cluster, clientID, rate string) {
	t.Helper()
	req := kmsg.NewPtrAlterClientQuotasRequest()
	e := kmsg.NewAlterClientQuotasRequestEntry()
	ent := kmsg.NewAlterClientQuotasRequestEntryEntity()
	ent.Type, ent.Name = "client-id", &clientID
	e.Entity = append(e.Entity, ent)
	op := kmsg.NewAlterClientQuotasRequestEntryOp()
	op.Key = "producer_byte_rate"
	if rate == "" {
		op.Remove = true
	} else {
		v, err := strconv.ParseFloat(rate, 64)
		if err != nil {
			t.Fatal(err)
		}
		op.Value = v
	}
	e.Ops = append(e.Ops, op)
	req.Entries = append(req.Entries, e)
	for _, r := range adminRequest(t, cl, req).(*kmsg.AlterClientQuotasResponse).Entries {
		if r.ErrorCode != 0 {
			t.Fatalf("set producer quota of %s: error %d %v", clientID, r.ErrorCode, fmt.Sprint(r.ErrorMessage))
		}
	}
}

// TestInitialSyncProgress (issue 22, section 1): describe and /metrics
// report an initial sync's progress while it catches up: records and bytes
// left, the rate, an ETA and the time lag (bounded by when the records
// were produced); once caught up, time lag, ETA and bytes left are 0, and
// the mirrored-records counter equals the records copied. A 1 MB/s quota
// on the destination stretches the copy of 6 MiB into bursts (a broker
// lets a request through and throttles the next), with the mirror behind
// the source between them.
func TestInitialSyncProgress(t *testing.T) {
	const clientID = "kmirror-progress-test"
	setProducerQuota(t, env.dst, clientID, "1000000") // bytes/s
	t.Cleanup(func() { setProducerQuota(t, env.dst, clientID, "") })
	waitQuotaApplied(t, clientID)
	m := startMember(t, "progress", memberOpts{destExtra: "  client_id: " + clientID + "\n"})
	ctx := context.Background()
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "isp", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	const topic, partitions, records = "isp-topic", 2, 6000
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	var recs []*kgo.Record
	for i := range records {
		value := make([]byte, 1024)
		rand.Read(value)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Key: []byte(strconv.Itoa(i)), Value: value})
	}
	producedFrom := time.Now()
	produceSync(t, kgoClient(t, env.src, kgo.ProducerLinger(0), kgo.RecordPartitioner(kgo.ManualPartitioner())), recs)
	producedTo := time.Now()
	if _, err := m.client.AddTopics(ctx, api.AddTopicsRequest{Mirror: "isp", Topics: []string{topic}}); err != nil {
		t.Fatal(err)
	}
	requireCatchingUpProgress(t, m, "isp", topic, producedFrom, producedTo)
	for _, p := range waitCaughtUp(t, m, "isp", topic) {
		if p.TimeLagMs != 0 || p.EtaSeconds != 0 || p.BytesLeft != 0 {
			t.Errorf("partition %d caught up shows time lag %d ms, ETA %d s, %d bytes left; want 0", p.Partition, p.TimeLagMs, p.EtaSeconds, p.BytesLeft)
		}
	}
	requireSameRecords(t, readAll(t, env.src, topic, partitions, true), readAll(t, env.dst, topic, partitions, true))
	text := metricsText(t, m)
	if got := sumMetric(t, text, "kmirror_partition_mirrored_records_total"); got != records {
		t.Errorf("kmirror_partition_mirrored_records_total sums to %v, want the %d records copied\n%s", got, records, text)
	}
	if got := sumMetric(t, text, "kmirror_partition_mirrored_bytes_total"); got < records*1024 {
		t.Errorf("kmirror_partition_mirrored_bytes_total sums to %v, want at least the %d KiB of values copied", got, records)
	}
	if got := sumMetric(t, text, "kmirror_partition_time_lag_seconds"); got != 0 {
		t.Errorf("kmirror_partition_time_lag_seconds sums to %v once caught up, want 0", got)
	}
}

// requireCatchingUpProgress waits until describe shows a partition of
// topic behind, with the progress of its initial sync: a rate, an ETA,
// bytes left, and a time lag within what the records' timestamps allow
// (produced between from and to, read between the request's start and
// end).
func requireCatchingUpProgress(t *testing.T, m *member, mirror, topic string, from, to time.Time) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		asked := time.Now()
		rows, err := m.client.Describe(context.Background(), mirror, topic)
		answered := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range rows {
			if p.Lag <= 0 || p.RecordsPerSec <= 0 || p.EtaSeconds <= 0 || p.BytesLeft <= 0 || p.TimeLagMs <= 0 {
				continue
			}
			if lo, hi := asked.Sub(to).Milliseconds(), answered.Sub(from).Milliseconds(); p.TimeLagMs < lo || p.TimeLagMs > hi {
				t.Fatalf("partition %d: time lag %d ms, want between %d and %d ms (records produced %s..%s)", p.Partition, p.TimeLagMs, lo, hi,
					from.Format(time.StampMilli), to.Format(time.StampMilli))
			}
			if p.BytesLeft < p.Lag*1024 {
				t.Fatalf("partition %d: %d bytes left for %d records of 1 KiB values", p.Partition, p.BytesLeft, p.Lag)
			}
			t.Logf("partition %d catching up: %d records and %d bytes left, %.0f records/s, %.0f bytes/s, ETA %d s, time lag %d ms",
				p.Partition, p.Lag, p.BytesLeft, p.RecordsPerSec, p.BytesPerSec, p.EtaSeconds, p.TimeLagMs)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no partition showed the progress of its initial sync within 30s: %+v", rows)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sumMetric sums every series of a metric in a /metrics text.
func sumMetric(t *testing.T, text, name string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + name + `(?:\{[^}]*\})? ([0-9.e+-]+)$`)
	sum := 0.0
	found := false
	for _, mm := range re.FindAllStringSubmatch(text, -1) {
		v, err := strconv.ParseFloat(mm[1], 64)
		if err != nil {
			t.Fatal(err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("/metrics has no %s", name)
	}
	return sum
}

// throttleSeen is a franz-go hook noting a broker's produce throttle.
type throttleSeen struct{ seen atomic.Bool }

func (h *throttleSeen) OnBrokerThrottle(_ kgo.BrokerMetadata, d time.Duration, _ bool) {
	if d > 0 {
		h.seen.Store(true)
	}
}

// waitQuotaApplied produces with clientID to a scratch topic of the
// destination until a broker throttles it: a client quota reaches the
// brokers through the metadata log, a moment after it is set.
func waitQuotaApplied(t *testing.T, clientID string) {
	t.Helper()
	topic := "quota-probe-" + clientID
	if err := env.dst.CreateTopic(context.Background(), topic, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	hook := &throttleSeen{}
	c := kgoClient(t, env.dst, kgo.ClientID(clientID), kgo.WithHooks(hook), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	value := make([]byte, 64<<10)
	for deadline := time.Now().Add(60 * time.Second); !hook.seen.Load(); {
		if time.Now().After(deadline) {
			t.Fatalf("the producer quota of %s was not applied by the destination within 60s", clientID)
		}
		var recs []*kgo.Record
		for range 16 {
			recs = append(recs, &kgo.Record{Value: value})
		}
		produceSync(t, c, recs)
	}
}
