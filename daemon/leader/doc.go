// Package leader is the raft leader's duties, run while the member leads
// (Nomad's monitorLeadership shape: a loop per leadership, cancelled when
// it is lost): the members known to the replicated state, placement
// (PlanAssignments: where partitions go, design.md section 3), pending
// topics finished, the topic watch (partitions added on the source, topics
// deleted or recreated), read-only mirror topics (DENY WRITE ACLs) and
// automatic failover.
//
// It reaches the member through narrow interfaces (Store, Member) and
// changes the replicated state only by raft commands it may submit
// (raftstore's command table: the leader's). It must not import the
// daemon; operator verbs and the owners' duties are not here.
package leader
