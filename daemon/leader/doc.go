// Package leader holds the raft leader's decisions that need no I/O:
// placement (where partitions go, design.md section 3: every active
// partition gets a live owner, the partitions of a member gone past the
// lease TTL are taken over, draining members hand theirs off, and counts
// are balanced by graceful handoffs, a few at a time). The same state and
// liveness give the same plan.
//
// The leader loop that applies the plan, and the leader's other duties
// (topic watch, read-only mirror topics, automatic failover, pending
// topics), still run as Member methods in package daemon (leader.go,
// topics.go, readonly.go, autofailover.go, pending.go); they move here
// next. The package must not import the daemon.
package leader
