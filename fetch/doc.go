// Package fetch is kmirror's data path (design.md sections 4 and 5): it
// fetches committed record batches from source brokers, one multi-partition
// fetch loop per source broker, forwards each data batch as one destination
// batch with a per-partition idempotent producer identity, and records
// progress and the offset-translation log in an internal destination topic.
//
// Exact resume rests on two rules. Each partition has its own producer
// identity, kept by the control plane, so whoever owns the partition
// continues its sequence numbers. Destination batches are a pure function of
// source batches, so after a crash the new owner re-creates the very batch
// the old owner may have left uncommitted, with the same sequence range, and
// the destination broker de-duplicates it. On takeover the owner walks the
// source from the last checkpoint and the destination up to its high
// watermark, verifying record by record, before producing again.
//
// The package knows nothing about raft: the daemon passes partition leases
// in as Specs and persists producer identities through the Control
// interface.
package fetch
