// Package api is kmirror's admin API contract: the request and response
// types of the HTTP routes, the sentinel errors with their status and code
// table (the server classifies errors with it, the client maps replies back
// to the same sentinels), and the HTTP client the CLI and the members use.
//
// It holds no server code and imports nothing of the daemon: a member
// (package daemon, through daemon/ops) implements Service, daemon/httpapi
// serves it; the CLI (cmd/kmirror) and the tests call it through Client.
// Member-to-member routes (/v1/internal/...) are in internal.go (the raft
// probe a joining member sends is httpapi's Auth.ProbePeer).
package api
