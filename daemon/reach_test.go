package daemon

import (
	"testing"
	"time"

	"github.com/kmirror/kmirror/fetch"
)

// TestDestinationUnansweredOutlivesTheProduce: a produce that went
// unanswered marks the destination unanswered for this member until its
// probe succeeds after it, also once the partition moved away (its
// produce dropped, not answered): the member looked answered again a
// second after its partitions left a stalled link, and got them back
// (issue 18).
func TestDestinationUnansweredOutlivesTheProduce(t *testing.T) {
	k := fetch.Key{Mirror: "m", Topic: "t", Partition: 0}
	stalledAt := time.Now().Add(-10 * time.Second)
	inFlight := true
	p := &destinationProbe{unansweredProduce: func() (time.Time, fetch.Key) {
		if inFlight {
			return stalledAt, k
		}
		return time.Time{}, fetch.Key{}
	}}
	if since, why := p.unanswered(); !since.Equal(stalledAt) || why == "" {
		t.Fatalf("with an unanswered produce: since %v (%q), want %v", since, why, stalledAt)
	}
	inFlight = false // the partition moved away: its produce was dropped
	if since, _ := p.unanswered(); !since.Equal(stalledAt) {
		t.Fatalf("once the partition left, unanswered since %v, want still %v: nothing has answered since", since, stalledAt)
	}
	p.mu.Lock()
	p.answered = time.Now() // the probe succeeded
	p.mu.Unlock()
	if since, why := p.unanswered(); !since.IsZero() {
		t.Fatalf("after the probe answered: unanswered since %v (%q), want answered", since, why)
	}
}
