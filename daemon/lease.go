package daemon

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"
)

// leaseState is this member's right to write its partitions (design.md
// section 3, self-fencing). A member may write while it has heard from the
// leader within lease_ttl - lease_margin, and only once its replicated
// state has caught up with the leader's since it started or was last
// fenced: raft heartbeats alone tell a follower that is far behind that it
// is in contact, while its state still shows partitions that have moved.
type leaseState struct {
	mu sync.Mutex
	// synced: the state caught up (read index) after the last fence.
	synced bool
	fenced bool
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
// may write.
func (m *Member) leaseWindow() time.Duration { return m.cfg.LeaseTTL - m.cfg.LeaseMargin }

// writeDeadline is the end of this member's lease, or the zero time when it
// has none.
func (m *Member) writeDeadline() time.Time {
	m.lease.mu.Lock()
	synced, checked := m.lease.synced, m.lease.checked
	m.lease.mu.Unlock()
	if !synced {
		return time.Time{}
	}
	dl := m.store.LeaseContact().Add(m.leaseWindow())
	if bound := checked.Add(leaseCheckSlack); bound.Before(dl) {
		dl = bound
	}
	return dl
}

// leaseSynced reports whether the owner loop may act on the state.
func (m *Member) leaseSynced() bool {
	m.lease.mu.Lock()
	defer m.lease.mu.Unlock()
	return m.lease.synced
}

// leaseLoop watches the lease: when the last contact is older than the
// lease window the member is fenced (it writes nothing); to write again it
// first syncs its state with the leader's (read index).
func (m *Member) leaseLoop() {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	last := time.Now()
	for {
		now := time.Now()
		// A gap between two runs of this loop longer than the window means
		// the process was paused: its partitions may have moved meanwhile,
		// even if raft has heard from the leader since it woke.
		paused := now.Sub(last) >= m.leaseWindow()
		last = now
		expired := paused || now.Sub(m.store.LeaseContact()) >= m.leaseWindow()
		m.lease.mu.Lock()
		lost := expired && !m.lease.fenced
		if lost {
			m.lease.fenced, m.lease.synced = true, false
			m.log.Warn("lease lost: no contact with the raft leader within lease_ttl - lease_margin; writing nothing until the state is synced again",
				zap.Duration("window", m.leaseWindow()), zap.Bool("paused", paused))
		}
		if !expired {
			m.lease.checked = now
		}
		synced := m.lease.synced
		m.lease.mu.Unlock()
		if lost {
			// Its partitions may move while it is cut off: drop them all,
			// queued batches included, and resume what it still owns with
			// a walk once the lease is back, instead of sending batches
			// fetched under the old lease.
			m.dropAll()
		}
		if !synced && !expired {
			ctx, cancel := context.WithTimeout(m.ctx, 5*time.Second)
			err := m.caughtUp(ctx)
			cancel()
			if err == nil {
				m.lease.mu.Lock()
				was := m.lease.fenced
				m.lease.synced, m.lease.fenced = true, false
				m.lease.mu.Unlock()
				if was {
					m.log.Info("lease regained: state synced with the raft leader")
				}
			}
		}
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
	}
}
