package fetch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// TestVerifyRange: pairs are compared in order from the given offsets; the
// first that differs is named with both offsets, a limit stops early, and
// a destination that ends first is a mismatch too.
func TestVerifyRange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admins := make([]*kafka.Admin, 2)
	for i := range admins {
		cl, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		if err := cl.CreateTopic("t", 1, nil); err != nil {
			t.Fatal(err)
		}
		c, err := kgo.NewClient(kgo.SeedBrokers(cl.ListenAddrs()...), kgo.DefaultProduceTopic("t"), kgo.ProducerLinger(0))
		if err != nil {
			t.Fatal(err)
		}
		n := 20
		if i == 1 {
			n = 18 // the destination lacks the last two
		}
		at := time.UnixMilli(1_700_000_000_000)
		for j := 0; j < n; j++ {
			v := fmt.Sprint("v", j)
			if i == 1 && j == 10 {
				v = "changed" // the destination's record 10 differs
			}
			r := &kgo.Record{Key: []byte(fmt.Sprint("k", j)), Value: []byte(v), Timestamp: at.Add(time.Duration(j) * time.Millisecond)}
			if err := c.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
		admins[i] = kafka.NewAdmin(fmt.Sprint("cluster ", i), cl.ListenAddrs(), "test", nil)
		t.Cleanup(admins[i].Close)
	}
	src, dst := admins[0], admins[1]

	res, err := VerifyRange(ctx, src, dst, "t", 0, 0, 20, 0, 0)
	if err != nil || res.Compared != 10 || res.MismatchSource != 10 || res.MismatchDestination != 10 || !strings.Contains(res.Mismatch, "value differs") {
		t.Fatalf("full range: %+v, %v; want 10 equal pairs, then offset 10's values differing", res, err)
	}
	if res, err = VerifyRange(ctx, src, dst, "t", 0, 0, 10, 0, 0); err != nil || res.Compared != 10 || res.Mismatch != "" {
		t.Fatalf("offsets 0..9: %+v, %v; want 10 equal pairs", res, err)
	}
	if res, err = VerifyRange(ctx, src, dst, "t", 0, 3, 20, 3, 1); err != nil || res.Compared != 1 || res.Mismatch != "" {
		t.Fatalf("one sample at offset 3: %+v, %v; want 1 equal pair", res, err)
	}
	res, err = VerifyRange(ctx, src, dst, "t", 0, 11, 20, 11, 0)
	if err != nil || res.Compared != 7 || res.MismatchSource != 18 || !strings.Contains(res.Mismatch, "the destination ends before the copy of source offset 18") {
		t.Fatalf("offsets 11..19 over a destination of 18 records: %+v, %v; want 7 equal pairs, then the end named", res, err)
	}
}
