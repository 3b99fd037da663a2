// Package daemon is one kmirror member, wiring only: it builds the raft
// store (raftstore), the data path (fetch), the HTTP server (httpapi) from
// its configuration (config), and the member's duties in their packages
// (ops, leader, owner), each behind narrow interfaces this package
// implements. Its files:
//
//   - member.go: start and stop order; join.go: forming or joining the
//     group; metrics.go; security.go: source admin clients.
//   - forward.go: between members (the leader's and the other members'
//     clients, submitting a member's commands, asking every member).
//   - ready.go: the read barrier behind /readyz, describe and the owners.
//   - autofailover.go: every member probes its mirrors' sources; the
//     leader (daemon/leader) asks all members for their views.
//
// The duties: daemon/ops (the operator's verbs, on the leader),
// daemon/leader (the leader loop, placement, the topic watch, read-only
// mirror topics, automatic failover), daemon/owner (a member's partitions:
// lease, jobs, reports, outbox, group offset sync). Every change to the
// replicated state goes through raft commands whose authority the command
// table states (raftstore.Authorize). The HTTP contract is daemon/api;
// nothing here may be imported by it or by the CLI's commands.
package daemon
