package daemon

import (
	"context"
	"fmt"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// GrantLease answers a member's lease renewal (POST /v1/internal/lease) on
// the leader, design.md section 3: the caller must be the member it names
// (checkCaller), in the raft configuration, with raft heartbeats to it
// succeeding (a member whose raft answers are late or lost gets no lease,
// whatever its HTTP does), and this member must still lead (a quorum
// confirms it after the request arrived, so no later leader was elected
// before the member sent it) and have applied every entry of earlier
// terms (its barrier), so the state index it grants covers every
// committed move. The grant is recorded: the leader takes the
// member's partitions over lease_ttl after its last grant
// (leader.Alive). Errors: api.ErrNotLeader (retry with the leader),
// api.ErrUnavailable (heartbeats failing), api.ErrInvalid (caller not
// proven, or not a member).
func (m *Member) GrantLease(ctx context.Context) (api.LeaseGrant, error) {
	caller := api.CallerOf(ctx)
	if err := m.checkCaller(caller); err != nil {
		return api.LeaseGrant{}, err
	}
	return m.grantLease(ctx, caller.Member)
}

func (m *Member) grantLease(ctx context.Context, id string) (api.LeaseGrant, error) {
	if !m.store.IsLeader() {
		return api.LeaseGrant{}, fmt.Errorf("%w: this member is not the leader", api.ErrNotLeader)
	}
	servers, err := m.store.Servers()
	if err != nil {
		return api.LeaseGrant{}, fmt.Errorf("%w: %v", api.ErrNotLeader, err)
	}
	found := false
	for _, srv := range servers {
		found = found || srv.ID == id
	}
	if !found {
		return api.LeaseGrant{}, fmt.Errorf("%w: member %s is not in the raft configuration: it holds no lease", api.ErrInvalid, id)
	}
	if id != m.cfg.NodeID && m.store.PeerFailing(id) {
		return api.LeaseGrant{}, fmt.Errorf("%w: raft heartbeats from the leader to member %s are failing: no lease until they succeed", api.ErrUnavailable, id)
	}
	if err := m.store.VerifyLeader(ctx); err != nil {
		return api.LeaseGrant{}, fmt.Errorf("%w: leadership not confirmed by a quorum: %v", api.ErrNotLeader, err)
	}
	if !m.store.LeaderCaughtUp() {
		// The state index granted must cover every committed move: a
		// member whose state reached an index this leader had applied
		// before catching up could still show a partition an earlier
		// leader moved away from it.
		return api.LeaseGrant{}, fmt.Errorf("%w: the leader has not applied the entries of earlier terms yet (its barrier): no lease until it has", api.ErrUnavailable)
	}
	var idx uint64
	m.store.Read(func(s *raftstore.State) { idx = s.Index })
	if !m.store.RecordLeaseGrant(id, m.store.Clock().Now()) {
		return api.LeaseGrant{}, fmt.Errorf("%w: the leader is applying a takeover of member %s's partitions: no lease until it is applied", api.ErrUnavailable, id)
	}
	return api.LeaseGrant{Leader: m.cfg.NodeID, StateIndex: idx}, nil
}

// RenewLease asks the raft leader for this member's lease: itself when it
// leads, else over the leader's internal API. Errors: api.ErrNotFound when
// the leader is of an older build without the route (the member then
// counts raft's heartbeats, as that leader does), others: no lease this
// time.
func (m *Member) RenewLease(ctx context.Context) (api.LeaseGrant, error) {
	if m.store.IsLeader() {
		return m.grantLease(ctx, m.cfg.NodeID)
	}
	if m.leaseVia != nil {
		_, id := m.store.Leader()
		return m.leaseVia(ctx, id)
	}
	c, err := m.leaderClient()
	if err != nil {
		return api.LeaseGrant{}, err
	}
	return c.RenewLease(ctx)
}
