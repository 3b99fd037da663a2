// Package truncate finds where a stopped topic was last mirrored and
// repairs divergence by rebuilding (design.md section 8):
//
//   - state.go: the last mirrored position records of __kmirror_state
//     (LastMirrored), written at every stop and readable by plain Kafka.
//   - plan.go: Find, for a topic added while its destination topic
//     exists: the same direction again (re-add) or the other way
//     (failback), with the plan per partition, the translation to seed,
//     and the destination records past the last mirrored position
//     (divergent), including those an unclean leader election on the old
//     source left in place of mirrored ones (the leader epoch of the last
//     mirrored batch checked with OffsetForLeaderEpoch).
//   - truncate.go: Truncate, which copies divergent records into a
//     quarantine topic and deletes the destination topic for its rebuild:
//     stock Kafka cannot cut a log's tail.
//
// Detection of divergence while mirroring (foreign writes, source log
// truncation) lives in the data path (package fetch).
package truncate
