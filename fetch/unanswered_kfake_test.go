package fetch

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestUnansweredProduceIsReported: while the destination takes produce
// requests and never answers them (a stalled link: the request is
// written, no answer comes), the partition reports since when its produce
// has gone unanswered, through the timeouts, confirm walks and resends
// that follow; once the destination answers again the mark clears and the
// records are mirrored once each (issue 18: an owner whose destination
// link stalled kept its partitions, since nothing said so).
func TestUnansweredProduceIsReported(t *testing.T) {
	x := newKfakePair(t, func(c *Config) { c.ProduceTimeout = 300 * time.Millisecond })
	x.createTopic("t", 1)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	x.produce(x.src, "t", 0, 100)
	x.e.Assign(specs("t", 1))
	x.waitCaughtUp("t", 1)
	if since, _ := x.e.OldestUnansweredProduce(); !since.IsZero() {
		t.Fatalf("a destination that answers every produce reported unanswered since %v", since)
	}

	var stalled atomic.Bool
	wake := make(chan struct{})
	stalled.Store(true)
	x.dst.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		x.dst.KeepControl()
		if stalled.Load() {
			x.dst.SleepControl(func() { <-wake })
		}
		return nil, nil, false
	})
	before := time.Now()
	x.produce(x.src, "t", 100, 100)
	deadline := time.Now().Add(20 * time.Second)
	for {
		since, key := x.e.OldestUnansweredProduce()
		if !since.IsZero() && time.Since(since) > 2*time.Second {
			if key != k || since.Before(before) || !x.e.DestinationUnanswered(k).Equal(since) {
				t.Fatalf("unanswered since %v for %s (partition's own: %v), want %s, not before the stall began at %v",
					since, key, x.e.DestinationUnanswered(k), k, before)
			}
			break // kept through at least a few produce timeouts
		}
		if time.Now().After(deadline) {
			t.Fatalf("no unanswered produce reported after 20 s of a stalled destination: %v", since)
		}
		time.Sleep(50 * time.Millisecond)
	}

	stalled.Store(false)
	close(wake)
	x.waitCaughtUp("t", 1)
	if since, _ := x.e.OldestUnansweredProduce(); !since.IsZero() {
		t.Fatalf("still unanswered since %v after the destination answered again", since)
	}
	x.requireMirrored("t", 1)
}
