package owner

import (
	"context"
	"time"

	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// control implements fetch.Control: the engine's reports reach the raft
// leader from whichever member runs the partition, retried until applied.
type control struct{ o *Owner }

func (c *control) SaveProducer(ctx context.Context, k fetch.Key, gen uint64, id kafka.ProducerID) error {
	return c.o.member.Submit(ctx, raftstore.SetProducer{
		Key:        partitionKey(k),
		Producer:   raftstore.ProducerIdentity{ProducerID: id.ID, Epoch: id.Epoch, Allocated: true},
		Generation: gen,
		Owner:      c.o.cfg.NodeID,
	})
}

// Report records FAILED and DIVERGED (and the return to MIRRORING) in the
// replicated state, so describe shows the reason from any member. It names
// the generation the engine observed the change under, so the leader
// refuses it once the partition moved on (issue 19: it took the
// generation current when it was sent).
func (c *control) Report(k fetch.Key, gen uint64, state fetch.State, reason string, gapBelow int64) {
	var s raftstore.TopicState
	switch state {
	case fetch.Failed:
		s = raftstore.StateFailed
	case fetch.Diverged:
		s = raftstore.StateDiverged
	case fetch.Mirroring:
		s = raftstore.StateMirroring
	default:
		return
	}
	var cur raftstore.PartitionInfo
	found := false
	c.o.store.Read(func(st *raftstore.State) {
		if p, ok := st.Partition(partitionKey(k)); ok {
			cur, found = *p, true
		}
	})
	if !found || cur.Owner != c.o.cfg.NodeID || cur.Generation != gen || cur.State == raftstore.StateStopping || cur.State == raftstore.StateStopped {
		return
	}
	key := "state " + k.String()
	// This member's copy of the state may lag the leader's: a report it
	// sent (FAILED, say) may be applied after this read. So the replicated
	// state counts as told only if the last report this member put for the
	// partition says the same; otherwise this one must still go out, or the
	// late FAILED would stay shown for a partition that mirrors.
	same := func(last raftstore.Command) bool {
		l, ok := last.(raftstore.SetPartitionState)
		return ok && l.State == s && l.Reason == reason && l.GapBelow == gapBelow
	}
	if cur.State == s && cur.Reason == reason && cur.GapBelow == gapBelow && c.o.out.lastIs(key, same) {
		// Told already. A command still waiting under the key is this
		// same report (the last put): it stays, since dropping it lost a
		// FAILED put behind an in-flight MIRRORING (issue 19).
		return
	}
	c.o.out.put(key, raftstore.SetPartitionState{Key: partitionKey(k), State: s, Reason: reason, GapBelow: gapBelow,
		Lease: raftstore.Lease{Owner: c.o.cfg.NodeID, Generation: gen}})
}

func (c *control) RenewProducer(k fetch.Key, gen uint64, reason string) {
	c.o.out.put("renew "+k.String(), raftstore.RenewProducer{Key: partitionKey(k), Reason: reason,
		Lease: raftstore.Lease{Owner: c.o.cfg.NodeID, Generation: gen}})
}

// RecordGap records a gap skipped under kmirror resume --accept-gap;
// synchronous, since the partition must not mirror past an unrecorded gap.
func (c *control) RecordGap(ctx context.Context, k fetch.Key, gen uint64, from, to int64) error {
	return c.o.member.Submit(ctx, raftstore.RecordGap{Key: partitionKey(k), From: from, To: to,
		Lease: raftstore.Lease{Owner: c.o.cfg.NodeID, Generation: gen}})
}

// WriteDeadline is the end of this member's lease (lease.go).
func (c *control) WriteDeadline() time.Time { return c.o.writeDeadline() }
func (c *control) WriteDeadlineAhead(ahead time.Duration) time.Time {
	return c.o.writeDeadlineAhead(ahead)
}

// LeaseLosses counts this member's lease losses (lease.go).
func (c *control) LeaseLosses() uint64 {
	_, losses := c.o.leaseSynced()
	return losses
}
