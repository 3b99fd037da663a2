// Package ops serves the operator's verbs (api.Service but Ready) on the
// raft leader; a follower forwards each write there and answers reads once
// its state has caught up (a read index). One file per verb group:
//
//   - ops.go: the interfaces it works through (Store, Engine, Leader,
//     Member) and StoreErr (raftstore errors as API errors).
//   - mirrors.go: create, delete, remove, list, describe, translate.
//   - alter.go: alter (new properties, the same source cluster).
//   - addtopics.go, existing.go: add, a new topic or one whose
//     destination topic exists (continue, or truncate and re-add).
//   - pending.go: finishing PENDING topics (the leader asks for it on
//     each round).
//   - switchover.go, pause.go, resume.go, members.go, describegroups.go.
//
// It changes the replicated state only through raft commands an operator
// may submit (raftstore.Authorize), writes to Kafka only through
// fetch/kafka (topics, configs) and the data path's Engine (progress). It
// must not import the daemon, the HTTP server or the leader's and the
// owners' duties: it reaches them through its interfaces.
package ops
