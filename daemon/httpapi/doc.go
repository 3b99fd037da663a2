// Package httpapi is a member's HTTP server: the admin API routes over an
// api.Service, the member-to-member routes under /v1/internal over an
// Internal, the probes (/healthz, /readyz) and /metrics, and the API's
// security (Auth: TLS, the bearer token and its rotation, open routes, who
// sent a request (Identify), and the same settings as a client of the
// other members, on one shared transport), and the server's bounds
// (conns.go: timeouts, connections per client).
//
// It decodes requests, maps errors to statuses (api.Classify) and
// encodes answers; it decides nothing and must not import the daemon: the
// Member implements Service and Internal.
package httpapi
