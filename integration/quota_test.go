package integration

import (
	"context"
	"crypto/rand"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

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
