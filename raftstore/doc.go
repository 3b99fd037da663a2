// Package raftstore is kmirror's replicated control plane: mirrors, mirror
// topics with their partition assignments, and members, kept identical on
// every member by hashicorp/raft (design.md section 3). It knows nothing
// about Kafka.
//
// Files by job:
//   - state.go: the State and its types; Clone for copies.
//   - command.go: the commands and their log encoding. An entry is one type
//     byte (explicit numbers, never reused), one payload version byte, then
//     JSON. Types with the 0x80 bit are ignorable: a member that does not
//     know one skips it; any other unknown entry panics, because skipping
//     it would let the member diverge silently. Its table (init) also
//     says who may submit each command (the leader, an operator, a member)
//     and whether it must carry the partition's lease.
//   - authority.go: Authorize checks a submission against that table (the
//     leader's and the operator verbs' stores check every command they
//     apply; the internal-apply route takes only a member's commands about
//     itself, AuthorizeMember), and Apply checks a command's lease before
//     its applyX runs.
//   - fsm.go: Apply, a deterministic switch over small applyX methods (no
//     clock, no I/O, no leadership checks). A refused command leaves the
//     state unchanged and returns its error (ErrNotFound, ErrExists,
//     ErrStaleGeneration, ErrInvalid) as the apply response. Watch
//     notifies after every change.
//   - snapshot.go: snapshots are a header {format version, last index},
//     typed length-prefixed records and an end marker; restore builds a
//     fresh State and swaps it in, refusing unknown versions and records.
//   - store.go and open.go: Store wires the FSM to raft, raft-boltdb and
//     the TCP transport and turns raft's errors into ErrNotLeader.
//   - stream.go: the raft transport's connections (mutual TLS with
//     raft_tls, the isolation test hook, why a dial failed).
//   - hclog.go: routes raft's hclog output to the injected zap logger.
//
// Per-record progress, lag and the translation log never go through raft:
// they change at data rate. The package must not import Kafka clients or
// the daemon, nor read a clock or do I/O inside Apply.
package raftstore
