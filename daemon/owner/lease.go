package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/raftstore"
)

// leaseState is this member's right to write its partitions (design.md
// section 3, self-fencing). A member may write until lease_ttl -
// lease_margin after it sent the last renewal the leader granted
// (renew.go), and only once its replicated state has caught up with the
// leader's since it started or was last fenced: a grant counts only once
// the state has applied what the leader's had when it granted, and after
// a fence only a renewal sent after it counts.
type leaseState struct {
	mu sync.Mutex
	// synced: the state caught up after the last fence.
	synced bool
	fenced bool
	// fencedAt is when the lease was last lost.
	fencedAt time.Time
	// losses counts the times the lease was lost: specs carry it
	// (fetch.Spec.Fences), so the engine resumes with the walk a partition
	// whose generation changed across a fence.
	losses uint64
	// checked is when leaseLoop last found the lease valid. Writes stop
	// soon after it unless the loop runs again: a process that was paused
	// (SIGSTOP, a VM freeze) gets heartbeats on waking before the loop sees
	// the gap, and must not write on the strength of them.
	checked time.Time
}

// leaseCheckSlack bounds how long after leaseLoop's last check a member
// may still write (the loop runs every 100 ms).
const leaseCheckSlack = 500 * time.Millisecond

// leaseWindow is how long after its last contact with the leader a member
// may write: lease_ttl - lease_margin, less the clock-rate allowance.
func (o *Owner) leaseWindow() time.Duration {
	return o.cfg.LeaseTTL - o.cfg.LeaseMargin - clockRateAllowance(o.cfg.LeaseTTL)
}

// maxClockRateError is how far a member's clock may run from the leader's,
// as a fraction (500 ppm: the most NTP slews a clock, on top of crystal
// error of tens of ppm). The member times its window and the leader its
// lease_ttl each on its own monotonic clock; lease_margin covers the
// request in flight and nothing else (config.CheckLease).
const maxClockRateError = 500e-6

// clockRateAllowance is what the window gives up so that a member whose
// clock runs slow by maxClockRateError stops writing before a leader whose
// clock runs fast by as much takes over: both errors over lease_ttl (1 ms
// per second of it, 10 ms at the default 10 s).
func clockRateAllowance(leaseTTL time.Duration) time.Duration {
	return time.Duration(2 * maxClockRateError * float64(leaseTTL))
}

// writeDeadline is the end of this member's lease, or the zero time when it
// has none.
func (o *Owner) writeDeadline() time.Time { return o.writeDeadlineAhead(0) }

// writeDeadlineAhead is when a produce request with ahead of answer time
// owed before it on its connection (the produce window, fetch/DESIGN.md)
// must be wholly written: ahead before the lease's end, and no later than
// the lease loop's last check allows (leaseCheckSlack), which ahead does
// not move (it guards a paused process, not the answers). The zero time
// when this member has no lease.
func (o *Owner) writeDeadlineAhead(ahead time.Duration) time.Time {
	o.lease.mu.Lock()
	synced, checked := o.lease.synced, o.lease.checked
	o.lease.mu.Unlock()
	if !synced {
		return time.Time{}
	}
	// The data path and the kernel compare it with the process clock.
	clock := o.store.Clock()
	dl := clock.Real(o.leaseContact().Add(o.leaseWindow())).Add(-ahead)
	if bound := clock.Real(checked.Add(leaseCheckSlack)); bound.Before(dl) {
		dl = bound
	}
	return dl
}

// leaseSynced reports whether the owner loop may act on the state, and
// how many times the lease was lost so far.
func (o *Owner) leaseSynced() (synced bool, losses uint64) {
	o.lease.mu.Lock()
	defer o.lease.mu.Unlock()
	return o.lease.synced, o.lease.losses
}

// LeaseStatus reports whether this member may write its partitions now
// (its lease valid and its state caught up since the last fence), and
// how many times it lost the lease since it started.
func (o *Owner) LeaseStatus() (valid bool, losses uint64) {
	o.lease.mu.Lock()
	defer o.lease.mu.Unlock()
	return o.lease.synced && !o.lease.fenced, o.lease.losses
}

// leaseLoop watches the lease: when the last grant's renewal was sent
// longer than the lease window ago the member is fenced (it writes
// nothing); to write again it needs a grant sent after the fence, counted
// once its state has caught up (under a leader of an older build, a read
// index: CaughtUp).
func (o *Owner) leaseLoop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	clock := o.store.Clock()
	last := clock.Now()
	for {
		o.waitCheckUnpaused()
		now := clock.Now()
		// A gap between two runs of this loop longer than the window means
		// the process was paused: its partitions may have moved meanwhile,
		// even if raft has heard from the leader since it woke.
		paused := now.Sub(last) >= o.leaseWindow()
		last = now
		expired := paused || now.Sub(o.leaseContact()) >= o.leaseWindow()
		o.lease.mu.Lock()
		lost := expired && !o.lease.fenced
		if lost {
			o.lease.fenced, o.lease.synced, o.lease.fencedAt = true, false, now
			o.lease.losses++
			o.log.Warn(LogLeaseLost,
				zap.Duration("window", o.leaseWindow()), zap.Bool("paused", paused))
		}
		if !expired {
			o.lease.checked = now
		}
		synced, fencedAt := o.lease.synced, o.lease.fencedAt
		o.lease.mu.Unlock()
		if lost && o.ctx.Err() == nil {
			// Its partitions may move while it is cut off: drop them all,
			// queued batches included, and resume what it still owns with
			// a walk once the lease is back, instead of sending batches
			// fetched under the old lease. (At shutdown the data path is
			// draining: the write deadline alone fences it.)
			o.dropAll()
		}
		if !synced && !expired {
			err := o.leaseSync(fencedAt)
			if err == nil && !o.leaseAnnounced() {
				// The leader would take this member's partitions over
				// after its own lease_ttl, not this member's: write once
				// the state holds this member's (announce).
				err = errLeaseNotAnnounced
				o.log.Debug("lease: waiting for this member's lease_ttl to be recorded in the group's state")
			}
			if err == nil {
				o.lease.mu.Lock()
				was := o.lease.fenced
				o.lease.synced, o.lease.fenced = true, false
				o.lease.mu.Unlock()
				if was && fencedAt.IsZero() {
					o.log.Info("lease taken: granted by the raft leader, and the state synced with the leader's")
				} else if was {
					o.log.Info(LogLeaseRegained)
				}
			}
		}
		select {
		case <-o.leaseCtx.Done():
			return
		case <-t.C:
		}
	}
}

// leaseSync is nil once this member's state is synced with the leader's
// after a fence at fencedAt: a grant sent after it has been counted (its
// state index applied), or under a leader of an older build a read index.
func (o *Owner) leaseSync(fencedAt time.Time) error {
	if o.grantLegacy() {
		ctx, cancel := context.WithTimeout(o.ctx, 5*time.Second)
		defer cancel()
		return o.member.CaughtUp(ctx)
	}
	if !o.leaseContact().After(fencedAt) {
		return errNoGrantSinceFence
	}
	return nil
}

// Log lines of the lease that tests look for in a member's log.
const (
	LogLeaseLost     = "lease lost: no lease granted by the raft leader within lease_ttl - lease_margin; writing nothing until one is and the state is synced again"
	LogLeaseRegained = "lease regained: granted by the raft leader, and the state synced with the leader's"
)

var errNoGrantSinceFence = errors.New("no lease granted since this member was fenced")

var errLeaseNotAnnounced = errors.New("this member's lease_ttl is not recorded in the state yet")

// leaseAnnounced reports whether the state records this member with its
// own lease_ttl, which the leader's takeover waits out (leader.TakeoverAfter).
func (o *Owner) leaseAnnounced() bool {
	ok := false
	o.store.Read(func(s *raftstore.State) {
		if mem, found := s.Members[o.cfg.NodeID]; found {
			ok = mem.LeaseTTLMs == o.cfg.LeaseTTL.Milliseconds()
		}
	})
	return ok
}
