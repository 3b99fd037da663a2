package api

import (
	"context"
	"crypto/x509"
	"net/http"
)

// Member-to-member calls: the routes under /v1/internal/ that members of
// one group use with each other; operators' tools have no use for them.

// ForwardedHeader marks a request one member forwarded to another; it is
// never forwarded again, so a leader change cannot make it loop.
const ForwardedHeader = "X-Kmirror-Forwarded"

// MemberHeader names the member that sends a member-to-member request;
// with api.tls its API certificate, presented as the TLS client
// certificate, proves it (Caller).
const MemberHeader = "X-Kmirror-Member"

// AsMember returns the client for member id calling others: its requests
// carry MemberHeader.
func (c *Client) AsMember(id string) *Client {
	c1 := *c
	c1.member = id
	return &c1
}

// Caller is who sent a request, as the server established it.
type Caller struct {
	// Member is the MemberHeader the request carried ("" for none).
	Member string
	// Cert is the TLS client certificate, verified against api.tls.ca_file
	// (nil: none was presented, or it did not verify, or no TLS).
	Cert *x509.Certificate
	// TLS reports whether the request came over TLS.
	TLS bool
}

type callerKey struct{}

// WithCaller records who sent a request in its context.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf is who sent the request (WithCaller); zero when not recorded.
func CallerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// AsForwarded returns the client for a member that forwards a request it
// was sent (to the leader, or a partition's owner): its requests carry
// ForwardedHeader, and a member that cannot be reached is reported as
// ErrNotLeader (retry), with member-to-member wording for TLS and token
// errors.
func (c *Client) AsForwarded() *Client {
	c1 := *c
	c1.forwarded = true
	return &c1
}

// ApplyInternal sends a raft command to the leader (member to member).
func (c *Client) ApplyInternal(ctx context.Context, entry []byte) error {
	return c.do(ctx, http.MethodPost, "/v1/internal/apply", nil, InternalApplyRequest{Entry: entry}, nil)
}

// LeaseGrant is the leader's answer to a member's lease renewal
// (POST /v1/internal/lease, design.md section 3). The member's lease runs
// lease_ttl - lease_margin from the moment it sent the renewal, and counts
// only once its own state has applied StateIndex: a partition the leader
// moved before granting has moved in the member's state too.
type LeaseGrant struct {
	// Leader is the member that granted it.
	Leader string `json:"leader"`
	// StateIndex is the raft index of the last command the leader's
	// state had applied when it granted (as RaftProbe.StateIndex).
	StateIndex uint64 `json:"state_index"`
}

// RenewLease asks the leader for a lease (member to member). A leader of
// an older build, which has no such route, answers ErrNotFound.
func (c *Client) RenewLease(ctx context.Context) (LeaseGrant, error) {
	var out LeaseGrant
	err := c.do(ctx, http.MethodPost, "/v1/internal/lease", nil, struct{}{}, &out)
	return out, err
}

// InternalReach asks a member how long each mirror's source and the
// destination have not answered it.
func (c *Client) InternalReach(ctx context.Context) (Reach, error) {
	var out Reach
	err := c.do(ctx, http.MethodGet, "/v1/internal/reach", nil, nil, &out)
	return out, err
}

// InternalGroups asks a member for the group sync rows of its partitions.
func (c *Client) InternalGroups(ctx context.Context) ([]GroupStatus, error) {
	var out []GroupStatus
	if err := c.do(ctx, http.MethodGet, "/v1/internal/groups", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// InternalStatus asks a member for the partitions it runs.
func (c *Client) InternalStatus(ctx context.Context) ([]LiveStatus, error) {
	var out []LiveStatus
	if err := c.do(ctx, http.MethodGet, "/v1/internal/status", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// RaftProbe answers GET /v1/internal/raft: what a starting member needs to
// know of a peer to decide between bootstrapping and joining.
type RaftProbe struct {
	NodeID string `json:"node_id"`
	// HasState: the peer runs with raft state (a group exists).
	HasState bool `json:"has_state"`
	// Joined lists the members the peer's state says have run with state.
	Joined []string `json:"joined,omitempty"`
	// StateIndex is the raft index of the last command the peer's state
	// applied; a follower reads only once it has applied as far as the
	// leader's (a read index).
	StateIndex uint64 `json:"state_index"`
	// Peers is the peer's configured peers list ("id=raft-address",
	// sorted): members that bootstrap a group together must agree on it.
	Peers []string `json:"peers,omitempty"`
}

type ctxKey int

const forwardedKey ctxKey = 1

// WithForwarded marks a request's context as forwarded by another member
// (it came with ForwardedHeader): its server does not forward it again.
func WithForwarded(ctx context.Context) context.Context {
	return context.WithValue(ctx, forwardedKey, true)
}

// IsForwarded reports whether a request was forwarded by another member
// (WithForwarded).
func IsForwarded(ctx context.Context) bool {
	v, _ := ctx.Value(forwardedKey).(bool)
	return v
}
