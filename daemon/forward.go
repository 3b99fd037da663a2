package daemon

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
	"github.com/kmirror/kmirror/daemon/ops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/raftstore"
)

// memberTimeout bounds a request from one member to another.
const memberTimeout = 2 * time.Minute

// memberHTTP is the HTTP address of member id: from the replicated state,
// else from the peers list.
func (m *Member) memberHTTP(id string) string {
	addr := ""
	m.store.Read(func(s *raftstore.State) {
		if mem, ok := s.Members[id]; ok {
			addr = mem.HTTPAddr
		}
	})
	if addr == "" {
		for _, p := range m.cfg.Peers {
			if p.ID == id {
				addr = p.HTTP
			}
		}
	}
	return addr
}

// isMemberID reports whether id names a member of the group (its state or
// this member's configured peers).
func (m *Member) isMemberID(id string) bool {
	if id == "" {
		return false
	}
	found := false
	m.store.Read(func(s *raftstore.State) { _, found = s.Members[id] })
	for _, p := range m.cfg.Peers {
		found = found || p.ID == id
	}
	return found
}

// MemberClient is a client of member id for forwarded requests.
func (m *Member) MemberClient(id string) (*api.Client, error) {
	addr := m.memberHTTP(id)
	if addr == "" {
		return nil, fmt.Errorf("%w: member %s has no known HTTP address", api.ErrUnavailable, id)
	}
	c, err := m.auth.ClientFor(addr, memberTimeout)
	if err != nil {
		return nil, err
	}
	return c.AsForwarded(), nil
}

// leaderClient is a client of the raft leader.
func (m *Member) leaderClient() (*api.Client, error) {
	_, id := m.store.Leader()
	if id == "" {
		if err := m.notInGroup(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: no raft leader is known right now; retry in a few seconds", api.ErrNotLeader)
	}
	if id == m.cfg.NodeID {
		return nil, fmt.Errorf("%w: leadership is changing; retry in a few seconds", api.ErrNotLeader)
	}
	return m.MemberClient(id)
}

// notInGroup is an error when this member is not in the raft configuration
// it knows (it was removed from the group), else nil.
func (m *Member) notInGroup() error {
	servers, err := m.store.Servers()
	if err != nil {
		return nil
	}
	for _, srv := range servers {
		if srv.ID == m.cfg.NodeID {
			return nil
		}
	}
	return fmt.Errorf("%w: this member (%s) is not in the raft group: it was removed (kmirror members remove); ask another member, "+
		"or add it again with kmirror members add %s --raft %s --http %s", api.ErrNotLeader, m.cfg.NodeID, m.cfg.NodeID, m.cfg.RaftAdvertise, m.AdvertisedHTTP())
}

// ToLeader returns nil when this member is the leader and should serve a
// write itself, or a client of the leader to forward it to. A request
// that was forwarded already is not forwarded again.
func (m *Member) ToLeader(ctx context.Context) (*api.Client, error) {
	if m.store.IsLeader() {
		return nil, nil
	}
	if api.IsForwarded(ctx) {
		return nil, fmt.Errorf("%w: this member stopped being the leader while the request was forwarded; retry", api.ErrNotLeader)
	}
	return m.leaderClient()
}

// Submit applies a command through the leader: here when this member
// leads, else over the leader's internal API. Errors wrap ErrStale,
// ErrInvalid, ErrNotFound, ErrExists (refused: do not retry) or
// ErrNotLeader and transport errors (retry).
func (m *Member) Submit(ctx context.Context, cmd raftstore.Command) error {
	if err := raftstore.Authorize(cmd, raftstore.ByMember); err != nil {
		return ops.StoreErr(err)
	}
	if m.store.IsLeader() {
		return ops.StoreErr(m.store.Apply(ctx, cmd))
	}
	entry, err := raftstore.Encode(cmd)
	if err != nil {
		return err
	}
	if m.applyVia != nil {
		_, id := m.store.Leader()
		return m.applyVia(ctx, id, entry)
	}
	c, err := m.leaderClient()
	if err != nil {
		return err
	}
	return c.ApplyInternal(ctx, entry)
}

// ApplyInternal applies a command a member sent to this leader. The
// caller must be a member speaking for itself (raftstore.AuthorizeMember),
// proven with api.tls by its API certificate (checkCaller).
func (m *Member) ApplyInternal(ctx context.Context, entry []byte) error {
	cmd, err := raftstore.Decode(entry)
	if err != nil {
		return fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	caller := api.CallerOf(ctx)
	if err := m.checkCaller(caller); err != nil {
		return err
	}
	if err := raftstore.AuthorizeMember(cmd, caller.Member); err != nil {
		return ops.StoreErr(err)
	}
	if err := m.keepsAddresses(cmd); err != nil {
		return err
	}
	if !m.store.IsLeader() {
		return fmt.Errorf("%w: this member is not the leader", api.ErrNotLeader)
	}
	return ops.StoreErr(m.store.Apply(ctx, cmd))
}

// keepsAddresses refuses a member's UpsertMember that is not an announce
// (joined, a lease_ttl within config.MaxLeaseTTL) or would change the
// addresses its record holds: other members forward requests, with the
// API token and mirror properties, to the HTTP address in the state, so a
// caller naming a member (taken as given without api.tls) must not
// redirect it (issue 18). A member moves by remove and add.
func (m *Member) keepsAddresses(cmd raftstore.Command) error {
	up, ok := cmd.(raftstore.UpsertMember)
	if !ok {
		return nil
	}
	var cur raftstore.Member
	found := false
	m.store.Read(func(s *raftstore.State) {
		if mem, ok := s.Members[up.Member.ID]; ok {
			cur, found = *mem, true
		}
	})
	// A member announces itself joined, every time: a record that says
	// otherwise is not a member's own (it would reopen the addresses
	// below), nor is a lease_ttl beyond what any member accepts.
	if !up.Member.Joined {
		return fmt.Errorf("%w: a member's own record says it joined: this one does not", api.ErrInvalid)
	}
	if ttl := time.Duration(up.Member.LeaseTTLMs) * time.Millisecond; ttl > config.MaxLeaseTTL {
		return fmt.Errorf("%w: lease_ttl %v is longer than any member accepts (%v)", api.ErrInvalid, ttl, config.MaxLeaseTTL)
	}
	// Only a member of the raft configuration announces itself (an
	// operator's members add, or the bootstrap peers, put it there), at
	// the raft address the configuration holds.
	servers, err := m.store.Servers()
	if err != nil {
		return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	i := slices.IndexFunc(servers, func(s raftstore.Server) bool { return s.ID == up.Member.ID })
	if i < 0 {
		return fmt.Errorf("%w: member %s is not in the group's raft configuration: add it first (kmirror members add %s ...)",
			api.ErrInvalid, up.Member.ID, up.Member.ID)
	}
	if !config.SameEndpoint(servers[i].Addr, up.Member.RaftAddr) {
		return fmt.Errorf("%w: member %s is in the raft configuration at %s, not %s", api.ErrInvalid, up.Member.ID, servers[i].Addr, up.Member.RaftAddr)
	}
	// The recorded addresses stay; an announce may spell them otherwise
	// (localhost for 127.0.0.1), as an operator's add may have.
	if !found || ((cur.HTTPAddr == "" || config.SameEndpoint(cur.HTTPAddr, up.Member.HTTPAddr)) &&
		(cur.RaftAddr == "" || config.SameEndpoint(cur.RaftAddr, up.Member.RaftAddr))) {
		return nil
	}
	return fmt.Errorf("%w: member %s is recorded at raft %s, http %s; a member cannot change its addresses itself "+
		"(requests are forwarded there): remove it (kmirror members remove %s) and add it again at the new addresses",
		api.ErrInvalid, cur.ID, cur.RaftAddr, cur.HTTPAddr, cur.ID)
}

// checkCaller establishes that a member route's caller is the member it
// names: over TLS its client certificate must verify against
// api.tls.ca_file and hold the host of that member's HTTP address (as its
// server certificate must); without TLS (loopback, or api.insecure) the
// name is taken as given (README, Security).
func (m *Member) checkCaller(c api.Caller) error {
	if c.Member == "" {
		return fmt.Errorf("%w: the request names no member (%s): only members submit commands here", api.ErrInvalid, api.MemberHeader)
	}
	if m.auth.ServerTLS() == nil {
		return nil
	}
	if c.Cert == nil {
		return fmt.Errorf("%w: member %s presented no API certificate signed by api.tls.ca_file: members prove who they are with it", api.ErrInvalid, c.Member)
	}
	// A certificate whose common name is a member's ID speaks for that
	// member only, whatever hosts it holds: the way to tell members that
	// share a host, or a shared (wildcard) certificate, apart.
	if cn := c.Cert.Subject.CommonName; cn != c.Member && m.isMemberID(cn) {
		return fmt.Errorf("%w: the certificate presented is member %s's (its common name), not %s's", api.ErrInvalid, cn, c.Member)
	}
	addr := m.memberHTTP(c.Member)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: member %s has no known HTTP address", api.ErrInvalid, c.Member)
	}
	if err := c.Cert.VerifyHostname(host); err != nil {
		return fmt.Errorf("%w: the certificate presented (%s) is not member %s's: it does not hold %s, the host of its HTTP address",
			api.ErrInvalid, c.Cert.Subject, c.Member, host)
	}
	return nil
}

// LocalStatuses are the partitions this member's data path runs.
func (m *Member) LocalStatuses() []api.LiveStatus {
	sts := m.engine.Statuses()
	out := make([]api.LiveStatus, 0, len(sts))
	now := time.Now()
	// The destination not answering this member (its probe, or any of its
	// partitions' produce) makes every partition's offsets stale, also one
	// with nothing in flight (issue 18: those showed MIRRORING with a lag).
	memberSince := m.DestinationUnanswered()
	verified := m.verify.progress()
	for _, st := range sts {
		age, fetchWait := int64(-1), int64(0)
		if !st.SourceAnswered.IsZero() {
			age = now.Sub(st.SourceAnswered).Milliseconds()
		}
		if !st.SourceAsked.IsZero() {
			fetchWait = now.Sub(st.SourceAsked).Milliseconds()
		}
		produceWait := produceWaitMs(now, memberSince, st.SentAt, st.DestinationUnanswered)
		out = append(out, api.LiveStatus{
			SourceAgeMs: age, FetchWaitMs: fetchWait, ProduceWaitMs: produceWait,
			Mirror: st.Key.Mirror, Topic: st.Key.Topic, Partition: st.Key.Partition,
			State: string(st.State), Retrying: st.Retrying, SourceEnd: st.SourceEnd, SourcePosition: st.Position.SourceOffset,
			DestinationOffset: st.Position.DestinationOffset, Lag: st.Lag,
			DuplicateRecords: st.DuplicateRecords, Duplicate: st.Duplicate, Waiting: st.Waiting, Throttled: st.Throttled,
			ConvertedRecords: st.ConvertedRecords, MirroredRecords: st.MirroredRecords, MirroredBytes: st.MirroredBytes,
			RecordsPerSec: st.RecordsPerSec, BytesPerSec: st.BytesPerSec, TimeLagMs: &st.TimeLagMs,
		})
		if v, ok := verified[st.Key]; ok {
			last := &out[len(out)-1]
			last.VerifiedUpTo, last.VerifiedRecords, last.VerifyMismatch, last.VerifyNote = max(v.UpTo, 0), v.Records, v.Mismatch, v.Skipped
			if v.Gone != "" {
				last.VerifyNote = strings.TrimPrefix(last.VerifyNote+"; "+v.Gone, "; ")
			}
		}
	}
	return out
}

// produceWaitMs is how long, in ms, a partition's offsets have waited on
// the destination: since its produce left unanswered was sent (through
// the timeouts and resends after it: unanswered is set only while no
// answer came since, never after sentAt), or since the destination stopped
// answering this member at all (memberSince: its probe or any produce),
// whichever is longer; 0 when neither waits.
func produceWaitMs(now, memberSince, sentAt, unanswered time.Time) int64 {
	wait := int64(0)
	if !memberSince.IsZero() {
		wait = now.Sub(memberSince).Milliseconds()
	}
	sent := sentAt
	if !unanswered.IsZero() {
		sent = unanswered
	}
	if !sent.IsZero() {
		wait = max(wait, now.Sub(sent).Milliseconds())
	}
	return wait
}

// LiveStatuses collects what every member's data path reports right now,
// keyed by partition; members that do not answer within a few seconds are
// left out (their partitions show without offsets) and named in silent.
func (m *Member) LiveStatuses(ctx context.Context) (out map[fetch.Key]api.LiveStatus, silent map[string]bool) {
	out = map[fetch.Key]api.LiveStatus{}
	add := func(sts []api.LiveStatus) {
		for _, st := range sts {
			out[fetch.Key{Mirror: st.Mirror, Topic: st.Topic, Partition: st.Partition}] = st
		}
	}
	answers, silent := askOthers(ctx, m, 3*time.Second, (*api.Client).InternalStatus)
	for _, sts := range answers {
		add(sts)
	}
	// This member's own view last: it wins for partitions it runs.
	add(m.LocalStatuses())
	return out, silent
}

// GroupRows is every member's group offset sync rows (ops.Member); members
// that do not answer within a few seconds are named in silent.
func (m *Member) GroupRows(ctx context.Context) (rows []api.GroupStatus, silent map[string]bool) {
	rows = m.LocalGroupRows()
	answers, silent := askOthers(ctx, m, 3*time.Second, (*api.Client).InternalGroups)
	for _, r := range answers {
		rows = append(rows, r...)
	}
	return rows, silent
}

// LocalGroupRows serves /v1/internal/groups.
func (m *Member) LocalGroupRows() []api.GroupStatus { return m.own.Groups().LocalRows() }

// askOthers asks every other member of the group at once, each within
// timeout, and returns the answers by member ID; members that cannot be
// reached or fail are named in failed.
func askOthers[T any](ctx context.Context, m *Member, timeout time.Duration, ask func(*api.Client, context.Context) (T, error)) (answers map[string]T, failed map[string]bool) {
	answers, failed = map[string]T{}, map[string]bool{}
	var ids []string
	m.store.Read(func(s *raftstore.State) {
		for id := range s.Members {
			if id != m.cfg.NodeID {
				ids = append(ids, id)
			}
		}
	})
	var mu sync.Mutex
	var wg sync.WaitGroup
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, id := range ids {
		c, err := m.MemberClient(id)
		if err != nil {
			failed[id] = true
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := ask(c, cctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed[id] = true
				m.auth.PeerFailed(id, err)
				return
			}
			answers[id] = v
		}()
	}
	wg.Wait()
	return answers, failed
}

// mirrorsSnapshot copies every mirror of the replicated state.
func (m *Member) mirrorsSnapshot() map[string]raftstore.Mirror {
	mirrors := map[string]raftstore.Mirror{}
	m.store.Read(func(s *raftstore.State) {
		for n, mir := range s.Mirrors {
			mirrors[n] = *mir.Clone()
		}
	})
	return mirrors
}

func (m *Member) TestHooks() bool { return m.cfg.TestHooks }

// SetRaftIsolated cuts or restores this member's raft traffic (test hook).
func (m *Member) SetRaftIsolated(on bool) error { return m.store.SetIsolated(on) }

func (m *Member) BlockSource(mirror string, on bool) { m.sources.setBlocked(mirror, on) }
