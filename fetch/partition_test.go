package fetch

import (
	"strings"
	"testing"
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
