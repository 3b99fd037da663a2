// Package daemon is one kmirror member: it wires the raft store
// (raftstore), the data path (fetch), the HTTP server (httpapi) and its
// configuration (config) together, and holds the member's duties, each in
// its own files:
//
//   - wiring: member.go (start and stop order), join.go (forming or joining
//     the group), metrics.go, security.go (source connection settings).
//   - operator verbs, run on the leader (requests are forwarded there):
//     service.go (create, delete, remove, list, describe, translate),
//     addtopics.go and existing.go (add, and re-add over an existing
//     destination topic), mirrorprops.go (alter), members.go, pause.go,
//     resume.go, switchover.go, ready.go (the read barrier behind
//     /readyz and describe).
//   - leader duties, while this member leads: package daemon/leader (the
//     loop, placement, the topic watch, read-only mirror topics, automatic
//     failover); here pending.go (finishing PENDING topics, which the
//     leader asks for) and autofailover.go (every member probes its
//     sources; the leader asks all members for their views).
//   - owner duties, on every member for the partitions it owns: package
//     daemon/owner (the lease, reconciling leases with the data path, the
//     handoff, stop and drop jobs, the data path's reports, the outbox,
//     this member's record); here groups.go and groupsync.go (consumer
//     group offset sync).
//   - between members: forward.go (the leader's and the owners' clients,
//     submitting commands, asking every member).
//
// Every change to the replicated state goes through raft commands whose
// authority the command table states (raftstore.Authorize); the package
// writes to Kafka only through fetch and fetch/kafka. The HTTP contract
// is daemon/api; nothing here may be imported by it or by the CLI's
// commands.
package daemon
