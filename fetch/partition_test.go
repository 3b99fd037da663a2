package fetch

import (
	"context"
	"strings"
	"testing"
	"time"
)

// Every test of this package runs with the move tables enforced: an engine
// test that drives a partition through a move the tables do not list
// panics.
func init() { strictMoves = true }

// TestMoveTables: the tables list a row for every sub-state, only the
// documented moves pass, and an illegal one is caught.
func TestMoveTables(t *testing.T) {
	if len(lifeMoves) != len(lifeNames) || len(releaseMoves) != len(releaseNames) || len(sendMoves) != len(sendNames) || len(fetchMoves) != len(fetchNames) {
		t.Fatal("a move table lacks a row for a sub-state")
	}
	p := &partition{spec: Spec{Key: Key{Mirror: "m", Topic: "t"}}}
	p.moveLife(lifeMirroring)
	p.moveSend(sendInflight)
	p.moveSend(sendIdle)
	p.moveSend(sendConfirming)
	p.moveRelease(releaseDraining)
	if got := p.reported(); got != Draining {
		t.Fatalf("mirroring while draining reports %s, want DRAINING", got)
	}
	p.moveLife(lifeFailed)
	if got := p.reported(); got != Failed {
		t.Fatalf("failed reports %s", got)
	}
	for _, c := range []struct {
		name string
		move func(*partition)
		want string
	}{
		{"a confirm of a batch in flight", func(p *partition) { p.moveSend(sendInflight); p.moveSend(sendConfirming) }, "illegal send move inflight -> confirming"},
		{"a send while its outcome is unknown", func(p *partition) { p.moveSend(sendConfirming); p.moveSend(sendInflight) }, "illegal send move confirming -> inflight"},
		{"a renewal out of a backoff", func(p *partition) { p.moveLife(lifeFailed); p.moveLife(lifeRenewing) }, "illegal life move failed -> renewing"},
		{"a stopped partition starting again", func(p *partition) { p.moveLife(lifeStopped); p.moveLife(lifeStarting) }, "illegal life move stopped -> starting"},
		{"a dropped partition drained", func(p *partition) { p.moveRelease(releaseDropped); p.moveRelease(releaseDraining) }, "illegal release move dropped -> draining"},
		{"mirroring out of a divergence without a start", func(p *partition) { p.moveLife(lifeDiverged); p.moveLife(lifeMirroring) }, "illegal life move diverged -> mirroring"},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if msg, _ := r.(string); !strings.Contains(msg, c.want) {
					t.Fatalf("got %v, want a panic with %q", r, c.want)
				}
			}()
			c.move(&partition{spec: Spec{Key: Key{Mirror: "m", Topic: "t"}}, life: lifeMirroring})
		})
	}
}

// TestDropTwice: a second Drop while the first waits for an in-flight
// produce (the lease loop's drop of everything racing the owner loop's) is
// legal: the partition stays dropped and stopped, no move panics, and both
// return once the produce answers.
func TestDropTwice(t *testing.T) {
	k := Key{Mirror: "m", Topic: "t"}
	p := &partition{spec: Spec{Key: k}, life: lifeMirroring, send: sendInflight}
	e := &Engine{parts: map[Key]*partition{k: p}}
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- e.Drop(context.Background(), k) }()
	}
	time.Sleep(50 * time.Millisecond) // both wait for the produce
	e.mu.Lock()
	if p.release != releaseDropped || p.life != lifeStopped {
		t.Errorf("after Drop: release %s, life %s", releaseNames[p.release], lifeNames[p.life])
	}
	p.moveSend(sendIdle) // the in-flight produce answers
	e.mu.Unlock()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if _, held := e.parts[k]; held || p.reported() != Stopped {
		t.Fatalf("a dropped partition is still held (%v) or reports %s", held, p.reported())
	}
}
