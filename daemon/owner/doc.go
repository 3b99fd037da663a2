// Package owner is a member's duties for the partitions leased to it
// (design.md section 3): the lease, whose window (lease_ttl - lease_margin
// after the last contact with the leader, once the state caught up) bounds
// every write (self-fencing); reconciling the leases in the replicated
// state with the data path (Assign, handoff, stop and drop jobs); the data
// path's control plane (Control: producer identities, state reports, gap
// records, the write deadline); the outbox that carries its commands to
// the leader until applied; the member's own record (announce, and
// handing its partitions off before it stops); and the consumer group
// offset sync of its partitions (groups.go, groupsync.go; design.md
// section 6).
//
// It reaches the member through narrow interfaces (Store, Member), writes
// records only through the data path (fetch) and group offsets only
// through fetch/kafka, and submits only the
// commands raftstore's table lets a member submit. It must not import the
// daemon, the leader's duties or the HTTP server.
package owner
