// Package fetch is kmirror's data path (design.md sections 4 and 5): it
// fetches committed record batches from source brokers, one multi-partition
// fetch loop per source broker (more across a long round trip, each a fetch
// session over its own share of the partitions: fetchConnsFor), forwards
// each data batch as one destination
// batch with a per-partition idempotent producer identity, and records
// progress and the offset-translation log in an internal destination topic.
//
// Exact resume rests on two rules. Each partition has its own producer
// identity, kept by the control plane, so whoever owns the partition
// continues its sequence numbers. Destination batches are a pure function of
// source batches, so the same source batch always becomes the same batch
// with the same sequence range.
//
// Nothing relies on the destination broker's de-duplication alone: the
// broker forgets a producer once the newest timestamp of its last batch is
// older than producer.id.expiration.ms, and mirrored batches keep the
// source's timestamps. So whenever a produce outcome is unknown (a lost
// connection or answer, a timeout, an error that can follow the append,
// a batch landing at an unexpected offset), the partition stops sending and
// establishes what landed: it walks the destination from its last
// acknowledged position to the end of the leader's log (waiting until
// records above the high watermark are committed or truncated) against the
// source, takes what it finds as acknowledged, and only then resends the
// rest with the same sequence numbers. On takeover the owner does the same
// walk from the last checkpoint. A batch of kmirror's own producer found
// twice is named and counted as such and stepped over; any other mismatch
// stops the partition (DIVERGED). DESIGN.md beside this file has the whole
// argument with the broker behaviour it rests on.
//
// In a group the same rules keep one writer per partition across members:
// a graceful handoff continues from the old owner's exact checkpoint
// (Spec.Handoff, no walk), a takeover keeps the producer identity and walks,
// and a member writes only within its lease (Control.WriteDeadline). The
// argument is in DESIGN.md, "One writer per partition across members".
//
// The package knows nothing about raft: the daemon passes partition leases
// in as Specs and persists producer identities through the Control
// interface.
//
// Files by job: engine.go (the engine's API and its partitions), route.go
// (which fetch loop serves a partition, and what it waits for), checkpoint.go,
// lookups.go (offset translation for the control plane), lifecycle.go
// (a partition's states in the engine), release.go (ending a partition's
// run here), resume.go (takeover), walk.go (reading source and destination
// side by side), realign.go (the walk after the source deleted records it
// had copied), confirm.go (unknown produce outcomes), fetcher.go and
// sender.go (the fetch and produce loops), partition.go (a partition's
// sub-states with their move tables, and its per-partition state), items.go
// (the produce queue), idle.go, offsets.go (the
// progress store: checkpoints and translation segments in the internal
// topic), translate.go (the translation log), failback.go (reading another
// group's progress store; seeding a partition; copying a record range),
// types.go (Key, Spec, Source, Control, Config, Status: what the daemon
// sees).
//
// Cluster access (metadata, pooled connections, the partition reader, the
// admin client) is in fetch/kafka; this package holds only the data path and
// its progress store, and imports neither the daemon nor raftstore.
package fetch
