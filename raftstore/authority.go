package raftstore

import (
	"fmt"
	"strings"
)

// Who may submit each command, and which commands must carry the
// partition's lease: one column pair of the command table (command.go's
// init), read by Authorize when a command is submitted and by Apply (the
// lease) before the command's apply function runs, the way etcd wraps its
// applier in checks.

// Submitter is who may submit a command type; a table entry holds a set.
type Submitter uint8

const (
	// ByLeader is the raft leader's own duties: placement, the topic watch,
	// read-only enforcement, automatic failover, pending topics.
	ByLeader Submitter = 1 << iota
	// ByOperator is an operator's verb (the admin API), run on the leader.
	ByOperator
	// ByMember is any member about itself or a partition it owns, sent to
	// the leader (POST /v1/internal/apply) or applied there when it leads.
	ByMember
)

func (b Submitter) String() string {
	var names []string
	for _, n := range []struct {
		bit  Submitter
		name string
	}{{ByLeader, "the leader"}, {ByOperator, "an operator"}, {ByMember, "a member"}} {
		if b&n.bit != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "nobody (replayed from old logs only)"
	}
	return strings.Join(names, " or ")
}

// LeaseRule says how a partition-scoped command's lease (the writer's owner
// and generation) is checked when it is applied.
type LeaseRule uint8

const (
	// NoLease: the command is not scoped to one partition's writer.
	NoLease LeaseRule = iota
	// LeaseRequired: refused (ErrStaleGeneration) unless the lease named is
	// the partition's current one.
	LeaseRequired
	// LeaseFromMember: without an owner it is the leader's own decision; a
	// member's report names its lease, which must be current.
	LeaseFromMember
	// LeaseGeneration: the generation must be current, and the owner too
	// when named. Entries written by builds before 2026-11-30 name no
	// owner and replay as they applied then; Authorize requires the owner
	// of every new submission.
	LeaseGeneration
)

// leased is a command scoped to one partition's writer.
type leased interface {
	Command
	leaseOf() (PartitionKey, Lease)
}

func (c SetPartitionState) leaseOf() (PartitionKey, Lease)  { return c.Key, c.Lease }
func (c RenewProducer) leaseOf() (PartitionKey, Lease)      { return c.Key, c.Lease }
func (c ReleasePartition) leaseOf() (PartitionKey, Lease)   { return c.Key, c.Lease }
func (c PartitionStopped) leaseOf() (PartitionKey, Lease)   { return c.Key, c.Lease }
func (c RecordGap) leaseOf() (PartitionKey, Lease)          { return c.Key, c.Lease }
func (c ClearGroupRestores) leaseOf() (PartitionKey, Lease) { return c.Key, c.Lease }
func (c SetProducer) leaseOf() (PartitionKey, Lease) {
	return c.Key, Lease{Owner: c.Owner, Generation: c.Generation}
}

// Authorize checks, before a command is submitted, that by may submit it
// (the command table's submitters), and that a member's partition-scoped
// command names its lease. Errors wrap ErrInvalid and say who may.
func Authorize(cmd Command, by Submitter) error {
	e, ok := commands[cmd.Type()]
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownCommand, cmd.Type())
	}
	if e.by&by == 0 {
		return fmt.Errorf("%w: %s may not submit %s; %s may", ErrInvalid, by, e.name, e.by)
	}
	if l, ok := cmd.(leased); ok && by == ByMember {
		if _, lease := l.leaseOf(); lease.Owner == "" {
			return fmt.Errorf("%w: a member's %s must name its lease (owner and generation)", ErrInvalid, e.name)
		}
	}
	return nil
}

// checkCommandLease applies a command's lease rule: a partition-scoped
// command from a writer whose lease is not current changes nothing.
func (s *State) checkCommandLease(rule LeaseRule, cmd Command) error {
	if rule == NoLease {
		return nil
	}
	k, lease := cmd.(leased).leaseOf()
	if rule == LeaseFromMember && lease.Owner == "" {
		return nil
	}
	p, err := s.partition(k)
	if err != nil {
		return err
	}
	if rule == LeaseGeneration {
		if lease.Generation != p.Generation || (lease.Owner != "" && lease.Owner != p.Owner) {
			return fmt.Errorf("%w: partition %s is leased to %q in generation %d, writer %q has %d", ErrStaleGeneration, k, p.Owner, p.Generation, lease.Owner, lease.Generation)
		}
		return nil
	}
	return checkLease(k, p, lease)
}

// SubjectOf is the member a member-submitted command speaks for: the
// lease's owner of a partition-scoped command, the member of UpsertMember
// and SetDraining; ok is false for a command that speaks for no member.
func SubjectOf(cmd Command) (member string, ok bool) {
	switch c := cmd.(type) {
	case leased:
		_, lease := c.leaseOf()
		return lease.Owner, true
	case UpsertMember:
		return c.Member.ID, true
	case SetDraining:
		return c.ID, true
	}
	return "", false
}

// AuthorizeMember is Authorize for a command member caller sent to the
// leader (POST /v1/internal/apply): a member may speak only for itself, so
// one member (or a holder of the operator token) cannot rewrite another's
// address, drain it or report for its partitions (issue 18). Errors wrap
// ErrInvalid.
func AuthorizeMember(cmd Command, caller string) error {
	if err := Authorize(cmd, ByMember); err != nil {
		return err
	}
	subject, ok := SubjectOf(cmd)
	if !ok {
		return fmt.Errorf("%w: %s speaks for no member; members may submit only commands about themselves", ErrInvalid, cmd.Type())
	}
	if caller == "" || subject != caller {
		return fmt.Errorf("%w: member %q may not submit %s for member %q: a member speaks only for itself", ErrInvalid, caller, cmd.Type(), subject)
	}
	return nil
}
