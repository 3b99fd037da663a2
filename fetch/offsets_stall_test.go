package fetch

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
)

// TestStalledCatchUpHoldsNothing: a read of the offsets topic that waits on
// a stalled destination (the connection open, nothing answered) must not
// hold the store's memory: checkpoints, the store's size and the other
// readers go on, and a second read gives up with its own context instead
// of queueing behind the first. Before, the read held the store's lock
// for its whole exchange, the engine's status read waited on it while
// holding the engine's lock, and a handoff of a partition on a stalled
// link waited 50 s (issue 22's CI).
func TestStalledCatchUpHoldsNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() }) // held open, never answered
			accepted <- struct{}{}
		}
	}()
	s := newOffsetStore(kafka.NewCluster("destination cluster", []string{ln.Addr().String()}, "test", nil), "__kmirror_offsets", nil)
	k := Key{Mirror: "m", Topic: "t", Partition: 0}
	s.checkpoints[k] = checkpoint{Src: 7, Dst: 9}

	first, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	firstDone := make(chan error, 1)
	go func() { firstDone <- s.catchUp(first) }()
	select {
	case <-accepted: // the first read waits on the stalled broker now
	case <-time.After(10 * time.Second):
		t.Fatal("the read never connected to the stalled broker")
	}

	within := func(what string, f func()) {
		t.Helper()
		done := make(chan struct{})
		go func() { f(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s waits behind a read stalled on the destination", what)
		}
	}
	within("checkpointOf", func() {
		if cp, ok := s.checkpointOf(k); !ok || cp.Src != 7 {
			t.Errorf("checkpointOf = %+v, %t", cp, ok)
		}
	})
	within("Bytes", func() { s.Bytes() })
	within("a second read with an ended context", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := s.catchUp(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for another read") {
			t.Errorf("second read: %v, want it to give up waiting for the first", err)
		}
	})

	cancelFirst()
	select {
	case err := <-firstDone:
		if err == nil {
			t.Fatal("the read of a stalled destination succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first read did not end with its context")
	}
}
