package kafka

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/findcoordinator"
	"github.com/segmentio/kafka-go/protocol/offsetcommit"
	"github.com/segmentio/kafka-go/protocol/offsetfetch"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// TopicPartition names a partition of a topic within one cluster.
type TopicPartition struct {
	Topic     string
	Partition int32
}

// Committed is a group's committed offset of one partition: the next
// offset the group reads, and the metadata string its consumer committed
// with it.
type Committed struct {
	Offset   int64
	Metadata string
}

// Kafka error codes of the group coordinator that kmirror handles by name.
const (
	CodeIllegalGeneration   int16 = 22
	CodeUnknownMemberID     int16 = 25
	CodeRebalanceInProgress int16 = 27
	CodeStaleMemberEpoch    int16 = 113
)

// coordinators caches each group's coordinator address per Admin.
type coordinators struct {
	mu    sync.Mutex
	addrs map[string]string
}

// ListGroups lists every group of the cluster: ListGroups goes to every
// broker, each answering for the groups it coordinates.
func (a *Admin) ListGroups(ctx context.Context) ([]kwire.GroupListing, error) {
	md, err := a.cl.Metadata(ctx, time.Minute)
	if err != nil {
		return nil, err
	}
	var out []kwire.GroupListing
	for id, addr := range md.Brokers {
		conn, err := a.cl.Borrow(ctx, addr)
		if err != nil {
			return nil, fmt.Errorf("list groups of %s: broker %d: %w", a.cl.Name, id, err)
		}
		rctx, cancel := ExchangeCtx(ctx)
		gs, err := conn.ListGroups(rctx)
		cancel()
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("list groups of %s: %w", a.cl.Name, err)
		}
		a.cl.GiveBack(addr, conn)
		out = append(out, gs...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// coordinator returns the address of a group's coordinator (FindCoordinator).
func (a *Admin) coordinator(ctx context.Context, group string) (string, error) {
	a.coord.mu.Lock()
	addr, ok := a.coord.addrs[group]
	a.coord.mu.Unlock()
	if ok {
		return addr, nil
	}
	msg, err := a.cl.roundTrip(ctx, &findcoordinator.Request{Key: group, KeyType: 0})
	if err != nil {
		return "", fmt.Errorf("find the coordinator of group %s on %s: %w", group, a.cl.Name, err)
	}
	res := msg.(*findcoordinator.Response)
	if res.ErrorCode != 0 {
		return "", &AdminError{Err: &kwire.Error{Code: res.ErrorCode, Topic: group, Partition: -1,
			Op: "find the coordinator of group on " + a.cl.Name}, Message: res.ErrorMessage}
	}
	addr = fmt.Sprintf("%s:%d", res.Host, res.Port)
	a.coord.mu.Lock()
	if a.coord.addrs == nil {
		a.coord.addrs = map[string]string{}
	}
	a.coord.addrs[group] = addr
	a.coord.mu.Unlock()
	return addr, nil
}

func (a *Admin) forgetCoordinator(group string) {
	a.coord.mu.Lock()
	delete(a.coord.addrs, group)
	a.coord.mu.Unlock()
}

// coordinatorMoved reports a code that means: ask FindCoordinator again.
func coordinatorMoved(code int16) bool {
	return code == kwire.CodeNotCoordinator || code == kwire.CodeCoordinatorNotAvailable || code == kwire.CodeCoordinatorLoading
}

// groupRequest sends msg to the group's coordinator, finding it again and
// retrying (at most 5 times, 200 ms apart) while the coordinator moves or
// loads. retry inspects the response for such codes.
func (a *Admin) groupRequest(ctx context.Context, group string, msg protocol.Message, moved func(protocol.Message) int16) (protocol.Message, error) {
	var res protocol.Message
	err := a.groupExchange(ctx, group, func(rctx context.Context, conn *kwire.Conn) (int16, error) {
		var err error
		res, err = conn.RoundTrip(rctx, msg)
		if err != nil {
			return 0, err
		}
		return moved(res), nil
	})
	return res, err
}

// groupExchange runs one exchange with the group's coordinator: exchange
// returns a transport error (the connection is closed) or the code of its
// answer that says the coordinator moved or loads. Like groupRequest, it
// finds the coordinator again and retries, at most 5 times, 200 ms apart.
func (a *Admin) groupExchange(ctx context.Context, group string, exchange func(context.Context, *kwire.Conn) (int16, error)) error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
			case <-time.After(200 * time.Millisecond):
			}
		}
		addr, err := a.coordinator(ctx, group)
		if err != nil {
			var ae *AdminError
			if errors.As(err, &ae) && coordinatorMoved(ae.Err.Code) {
				lastErr = err
				continue
			}
			return err
		}
		conn, err := a.cl.Borrow(ctx, addr)
		if err != nil {
			a.forgetCoordinator(group)
			lastErr = err
			continue
		}
		rctx, cancel := ExchangeCtx(ctx)
		code, err := exchange(rctx, conn)
		cancel()
		if errors.Is(err, kwire.ErrUnsupported) {
			a.cl.GiveBack(addr, conn) // refused before a byte was sent
			return fmt.Errorf("group %s on %s: %w", group, a.cl.Name, err)
		}
		if err != nil {
			conn.Close()
			a.forgetCoordinator(group)
			lastErr = fmt.Errorf("group %s on %s (coordinator %s): %w", group, a.cl.Name, addr, err)
			continue
		}
		a.cl.GiveBack(addr, conn)
		if coordinatorMoved(code) {
			a.forgetCoordinator(group)
			lastErr = &kwire.Error{Code: code, Topic: group, Partition: -1, Op: "group request on " + a.cl.Name}
			continue
		}
		return nil
	}
	return lastErr
}

// CommittedOffsets returns a group's committed offsets of the given
// partitions (OffsetFetch); a partition the group never committed is left
// out. Offsets of a pending transactional commit are not visible until the
// transaction commits (the broker answers the last committed ones).
func (a *Admin) CommittedOffsets(ctx context.Context, group string, parts []TopicPartition) (map[TopicPartition]Committed, error) {
	byTopic := map[string][]int32{}
	for _, tp := range parts {
		byTopic[tp.Topic] = append(byTopic[tp.Topic], tp.Partition)
	}
	req := &offsetfetch.Request{GroupID: group}
	for t, ps := range byTopic {
		req.Topics = append(req.Topics, offsetfetch.RequestTopic{Name: t, PartitionIndexes: ps})
	}
	msg, err := a.groupRequest(ctx, group, req, func(m protocol.Message) int16 {
		res := m.(*offsetfetch.Response)
		if res.ErrorCode != 0 {
			return res.ErrorCode
		}
		for _, t := range res.Topics {
			for _, p := range t.Partitions {
				if coordinatorMoved(p.ErrorCode) {
					return p.ErrorCode
				}
			}
		}
		return 0
	})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of group %s on %s: %w", group, a.cl.Name, err)
	}
	res := msg.(*offsetfetch.Response)
	if res.ErrorCode != 0 {
		return nil, &AdminError{Err: &kwire.Error{Code: res.ErrorCode, Topic: group, Partition: -1, Op: "committed offsets of group on " + a.cl.Name}}
	}
	out := map[TopicPartition]Committed{}
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return nil, &kwire.Error{Code: p.ErrorCode, Topic: t.Name, Partition: p.PartitionIndex,
					Op: fmt.Sprintf("committed offset of group %s on %s", group, a.cl.Name)}
			}
			if p.CommittedOffset >= 0 {
				out[TopicPartition{t.Name, p.PartitionIndex}] = Committed{Offset: p.CommittedOffset, Metadata: p.Metadata}
			}
		}
	}
	return out, nil
}

// CommitOffsets commits offsets for a group as a client outside the
// group's membership would (generation -1, no member ID, leader epoch
// unknown). The coordinator accepts that only while the group has no
// members, for classic and KIP-848 groups alike
// (ClassicGroup/ConsumerGroup.validateOffsetCommit), so a consumer that
// joins between kmirror's check and its commit makes the commit fail
// (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION or STALE_MEMBER_EPOCH) instead of
// overwriting the consumer's offsets. It returns the error of each
// partition the coordinator refused.
func (a *Admin) CommitOffsets(ctx context.Context, group string, offsets map[TopicPartition]Committed) (map[TopicPartition]error, error) {
	byTopic := map[string][]offsetcommit.RequestPartition{}
	for tp, c := range offsets {
		byTopic[tp.Topic] = append(byTopic[tp.Topic], offsetcommit.RequestPartition{
			PartitionIndex: tp.Partition, CommittedOffset: c.Offset, CommittedLeaderEpoch: -1, CommittedMetadata: c.Metadata,
		})
	}
	req := &offsetcommit.Request{GroupID: group, GenerationID: -1, RetentionTimeMs: -1}
	for t, ps := range byTopic {
		req.Topics = append(req.Topics, offsetcommit.RequestTopic{Name: t, Partitions: ps})
	}
	msg, err := a.groupRequest(ctx, group, req, func(m protocol.Message) int16 {
		for _, t := range m.(*offsetcommit.Response).Topics {
			for _, p := range t.Partitions {
				if coordinatorMoved(p.ErrorCode) {
					return p.ErrorCode
				}
			}
		}
		return 0
	})
	if err != nil {
		return nil, fmt.Errorf("commit offsets of group %s on %s: %w", group, a.cl.Name, err)
	}
	refused := map[TopicPartition]error{}
	for _, t := range msg.(*offsetcommit.Response).Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				refused[TopicPartition{t.Name, p.PartitionIndex}] = &kwire.Error{Code: p.ErrorCode, Topic: t.Name, Partition: p.PartitionIndex,
					Op: fmt.Sprintf("commit offset of group %s on %s", group, a.cl.Name)}
			}
		}
	}
	return refused, nil
}

// IsGroupInUse reports whether a refused commit means the group has
// members (a consumer joined between kmirror's look and its commit).
func IsGroupInUse(err error) bool {
	var kerr *kwire.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr.Code {
	case CodeIllegalGeneration, CodeUnknownMemberID, CodeRebalanceInProgress, CodeStaleMemberEpoch, kwire.CodeNonEmptyGroup:
		return true
	}
	return false
}
