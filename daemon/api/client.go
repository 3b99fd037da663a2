package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kmirror/kmirror/truncate"
)

// Client calls a member's admin API over HTTP. It implements Service: error
// replies come back as errors that wrap the same sentinel errors, so
// errors.Is(err, ErrNotFound) works on both sides, with the server's message.
type Client struct {
	// baseURLs are tried in order; a member that cannot be reached is
	// skipped for the next (any member answers, writes are forwarded to
	// the leader).
	baseURLs []string
	baseURL  string // the one being tried, for messages
	http     *http.Client
	// forwarded marks requests a member forwards to another, which must
	// not forward them again.
	forwarded bool
	// token is sent as Authorization: Bearer (api.token_file).
	token string
	// member is sent as MemberHeader by a member calling others.
	member string
}

// WithAuth returns the client with TLS settings for https:// servers
// (nil: the system's CAs) and a bearer token ("" for none). It makes a new
// transport (its own connections): a process that makes many clients uses
// WithTransport with one shared transport instead.
func (c *Client) WithAuth(tlsConfig *tls.Config, token string) *Client {
	if tlsConfig == nil {
		return c.WithTransport(nil, token)
	}
	return c.WithTransport(&http.Transport{TLSClientConfig: tlsConfig.Clone(), Proxy: http.ProxyFromEnvironment}, token)
}

// WithTransport returns the client sending its requests through rt (nil:
// unchanged) with a bearer token ("" for none). Clients that share rt share
// its pooled connections (issue 18: a transport per call leaked one
// connection per member-to-member call).
func (c *Client) WithTransport(rt http.RoundTripper, token string) *Client {
	c1 := *c
	if rt != nil {
		h := *c.http
		h.Transport = rt
		c1.http = &h
	}
	c1.token = token
	return &c1
}

var _ Service = (*Client)(nil)

// NewClient returns a client of the members at servers, a comma-separated
// list of URLs such as http://127.0.0.1:8080,http://127.0.0.1:8081, whose
// requests give up after timeout. A request goes to the first member that
// can be reached.
func NewClient(servers string, timeout time.Duration) (*Client, error) {
	c := &Client{http: &http.Client{Timeout: timeout}}
	for _, s := range strings.Split(servers, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("server URL %q: want http://host:port or https://host:port (several separated by commas)", s)
		}
		c.baseURLs = append(c.baseURLs, strings.TrimRight(u.String(), "/"))
	}
	if len(c.baseURLs) == 0 {
		return nil, fmt.Errorf("server URL %q: want http://host:port or https://host:port (several separated by commas)", servers)
	}
	c.baseURL = c.baseURLs[0]
	return c, nil
}

// CreateMirror implements Service.
func (c *Client) CreateMirror(ctx context.Context, req CreateMirrorRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/mirrors", nil, req, nil)
}

// DeleteMirror implements Service.
func (c *Client) DeleteMirror(ctx context.Context, name string, force bool) error {
	path, err := apiPath("/v1/mirrors/{}", name)
	if err != nil {
		return err
	}
	var query url.Values
	if force {
		query = url.Values{"force": {"true"}}
	}
	return c.do(ctx, http.MethodDelete, path, query, nil, nil)
}

// AddTopics implements Service.
func (c *Client) AddTopics(ctx context.Context, req AddTopicsRequest) (AddResult, error) {
	path, err := apiPath("/v1/mirrors/{}/topics", req.Mirror)
	if err != nil {
		return AddResult{}, err
	}
	wait := AddTimeout(len(req.Topics))
	if len(req.Include) > 0 {
		wait = AddTimeout(len(req.Topics) + discoveryTopicsBound)
	}
	if req.Truncate {
		// A truncation copies records and deletes a topic: wait for it.
		wait += TruncateTimeout
	}
	cl := *c
	cl.http = &http.Client{Timeout: max(c.http.Timeout, wait), Transport: c.http.Transport}
	var res AddResult
	err = cl.do(ctx, http.MethodPost, path, nil, req, &res)
	return res, err
}

// PlanTopics implements Service.
func (c *Client) PlanTopics(ctx context.Context, req AddTopicsRequest) ([]truncate.Plan, error) {
	path, err := apiPath("/v1/mirrors/{}/topics", req.Mirror)
	if err != nil {
		return nil, err
	}
	req.DryRun = true
	var res PlanResult
	if err := c.do(ctx, http.MethodPost, path, nil, req, &res); err != nil {
		return nil, err
	}
	return res.Plans, nil
}

// RemoveTopic implements Service. The member waits up to RemoveWait for the
// owners to stop the partitions: the client waits for that, whatever its
// own timeout.
func (c *Client) RemoveTopic(ctx context.Context, mirror, topic string) error {
	path, err := apiPath("/v1/mirrors/{}/topics/{}", mirror, topic)
	if err != nil {
		return err
	}
	long := *c
	long.http = &http.Client{Timeout: max(c.http.Timeout, RemoveWait+30*time.Second), Transport: c.http.Transport}
	return long.do(ctx, http.MethodDelete, path, nil, nil, nil)
}

// SwitchoverTopic implements Service. The request may take the whole timeout
// and then the stop: the client waits for that, whatever its own timeout.
func (c *Client) SwitchoverTopic(ctx context.Context, mirror, topic string, timeout time.Duration) ([]string, error) {
	path, err := apiPath("/v1/mirrors/{}/topics/{}", mirror, topic)
	if err != nil {
		return nil, err
	}
	long := *c
	long.http = &http.Client{Timeout: max(c.http.Timeout, timeout+RemoveWait+30*time.Second), Transport: c.http.Transport}
	var out StatusBody
	if err := long.do(ctx, http.MethodDelete, path, url.Values{"wait_for_sync": {timeout.String()}}, nil, &out); err != nil {
		return nil, err
	}
	return out.Notes, nil
}

// PauseTopics implements Service.
func (c *Client) PauseTopics(ctx context.Context, mirror, topic string) ([]string, error) {
	return c.pause(ctx, "pause", mirror, topic)
}

// UnpauseTopics implements Service.
func (c *Client) UnpauseTopics(ctx context.Context, mirror, topic string) ([]string, error) {
	return c.pause(ctx, "unpause", mirror, topic)
}

func (c *Client) pause(ctx context.Context, verb, mirror, topic string) ([]string, error) {
	path, err := apiPath("/v1/mirrors/{}/"+verb, mirror)
	if err != nil {
		return nil, err
	}
	query := url.Values{}
	if topic != "" {
		query.Set("topic", topic)
	}
	var res PauseResult
	if err := c.do(ctx, http.MethodPost, path, query, nil, &res); err != nil {
		return nil, err
	}
	return res.Topics, nil
}

// ResumePartitions implements Service.
func (c *Client) ResumePartitions(ctx context.Context, req ResumeRequest) ([]int32, error) {
	path, err := apiPath("/v1/mirrors/{}/topics/{}/resume", req.Mirror, req.Topic)
	if err != nil {
		return nil, err
	}
	req.Mirror, req.Topic = "", ""
	var res ResumeResult
	if err := c.do(ctx, http.MethodPost, path, nil, req, &res); err != nil {
		return nil, err
	}
	return res.Resumed, nil
}

// ListMirrors implements Service.
func (c *Client) ListMirrors(ctx context.Context) ([]MirrorSummary, error) {
	var mirrors []MirrorSummary
	if err := c.do(ctx, http.MethodGet, "/v1/mirrors", nil, nil, &mirrors); err != nil {
		return nil, err
	}
	return mirrors, nil
}

// Describe implements API; an empty mirror or topic matches all.
func (c *Client) Describe(ctx context.Context, mirror, topic string) ([]PartitionStatus, error) {
	query := url.Values{}
	if mirror != "" {
		query.Set("mirror", mirror)
	}
	if topic != "" {
		query.Set("topic", topic)
	}
	var rows []PartitionStatus
	if err := c.do(ctx, http.MethodGet, "/v1/describe", query, nil, &rows); err != nil {
		return nil, err
	}
	return rows, nil
}

// Verify implements Service.
func (c *Client) Verify(ctx context.Context, req VerifyRequest) ([]VerifyPartition, error) {
	long := *c
	long.http = &http.Client{Timeout: max(c.http.Timeout, VerifyTimeout+30*time.Second), Transport: c.http.Transport}
	var out []VerifyPartition
	err := long.do(ctx, http.MethodPost, "/v1/verify", nil, req, &out)
	return out, err
}

// Translate implements Service.
func (c *Client) Translate(ctx context.Context, mirror, topic string, partition int32, sourceOffset int64) (Translation, error) {
	query := url.Values{}
	query.Set("mirror", mirror)
	query.Set("topic", topic)
	query.Set("partition", strconv.Itoa(int(partition)))
	query.Set("offset", strconv.FormatInt(sourceOffset, 10))
	var res Translation
	err := c.do(ctx, http.MethodGet, "/v1/translate", query, nil, &res)
	return res, err
}

// Ready implements API: nil when the member's /readyz answers 200.
func (c *Client) Ready(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/readyz", nil, nil, nil)
}

// apiPath fills each {} of pattern with an escaped, non-empty segment.
func apiPath(pattern string, segments ...string) (string, error) {
	for _, s := range segments {
		if s == "" {
			return "", fmt.Errorf("%w: mirror and topic names must not be empty", ErrInvalid)
		}
		pattern = strings.Replace(pattern, "{}", url.PathEscape(s), 1)
	}
	return pattern, nil
}

// do sends one request with body (if not nil) as JSON and decodes a 2xx
// reply into out (if not nil), trying each server in turn while one cannot
// be reached or answers that it cannot serve the request now (503: no
// leader known, state catching up, the leader it forwards to not
// answering). Such a member did nothing with the request.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	var errs []error
	for i, base := range c.baseURLs {
		err := c.attempt(ctx, i < len(c.baseURLs)-1, base, method, path, query, body, out)
		var unreachable *unreachableError
		if (!errors.As(err, &unreachable) && !errors.Is(err, ErrNotLeader)) || ctx.Err() != nil {
			return err
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return errs[0]
	}
	msgs := make([]string, len(errs))
	var sentinel error
	for i, e := range errs {
		msgs[i] = e.Error()
		if errors.Is(e, ErrNotLeader) {
			sentinel = ErrNotLeader
		}
	}
	return &remoteError{msg: "no kmirror member could serve the request: " + strings.Join(msgs, "; "), sentinel: sentinel}
}

// attempt sends the request to one member. A read (GET) with other
// members left to ask gets a third of the client's timeout: a member that
// accepts connections but does not answer (frozen, overloaded) is then
// skipped for the next instead of using up the whole timeout. Writes are
// not: one that timed out may have been applied.
func (c *Client) attempt(ctx context.Context, more bool, base, method, path string, query url.Values, body, out any) error {
	if method != http.MethodGet || !more || c.http.Timeout <= 0 {
		return c.doAt(ctx, base, method, path, query, body, out)
	}
	wait := c.http.Timeout / 3
	actx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	err := c.doAt(actx, base, method, path, query, body, out)
	if err != nil && actx.Err() != nil && ctx.Err() == nil {
		return &unreachableError{fmt.Errorf("kmirror at %s did not answer within %s", base, wait)}
	}
	return err
}

// unreachableError means the member could not be reached at all, so the
// request did nothing there.
type unreachableError struct{ error }

func (e *unreachableError) Unwrap() error { return e.error }

func (c *Client) doAt(ctx context.Context, base, method, path string, query url.Values, body, out any) error {
	c1 := *c
	c1.baseURL = base
	c = &c1
	target := c.baseURL + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	var reqBody io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		reqBody = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, reqBody)
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if c.member != "" {
		req.Header.Set(MemberHeader, c.member)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.forwarded {
		req.Header.Set(ForwardedHeader, "1")
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if c.forwarded && ctx.Err() == nil {
			// A member forwarding a request: the member it forwards to
			// (the leader, or a partition's owner) is down or changing.
			return fmt.Errorf("%w: the member at %s it was forwarded to did not answer (%v); retry in a few seconds", ErrNotLeader, c.baseURL, err)
		}
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
			(method == http.MethodGet && notHTTP(err)) {
			// Nothing there serves the request (a read is safe to ask
			// elsewhere even if a member died while answering it).
			return &unreachableError{c.transportError(ctx, err)}
		}
		return c.transportError(ctx, err)
	}
	defer closeBody(resp.Body)
	if resp.StatusCode == http.StatusUnauthorized && c.forwarded {
		// A member calling another: the caller's token was good, this
		// member's is not the other's.
		return fmt.Errorf("%w: the member at %s refused this member's API token: the members' api.token_file files differ "+
			"(during a rotation, every member's file must hold both tokens before any sends the new one: see README, Security)", ErrUnavailable, c.baseURL)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return replyError(req, resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("kmirror at %s sent an unreadable reply to %s %s: %v", c.baseURL, method, path, err)
	}
	return nil
}

// closeBody reads what is left of a reply (a JSON decoder stops before
// its last newline) and closes it: only a body read to its end lets the
// transport reuse the connection (issue 18).
func closeBody(b io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(b, 1<<20)) //nolint:errcheck // the reply was read; this only frees the connection
	b.Close()
}

// notHTTP reports whether a request failed because the address answered
// without HTTP (closed or reset the connection, or sent something else):
// a Kafka or raft port given as --server.
func notHTTP(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(err.Error(), "malformed HTTP")
}

func (c *Client) transportError(ctx context.Context, err error) error {
	var netErr net.Error
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	switch {
	case errors.As(err, &unknownCA) && c.forwarded:
		return fmt.Errorf("%w: the member at %s presents an API certificate this member's api.tls.ca_file does not verify: "+
			"every member's API certificate must be signed by the CA in every member's api.tls.ca_file", ErrUnavailable, c.baseURL)
	case errors.As(err, &unknownCA):
		return fmt.Errorf("kmirror at %s presents a certificate signed by an authority this client does not trust: "+
			"pass --ca FILE (or KMIRROR_CA) with the CA that signs the members' API certificates (api.tls.ca_file); if you did, that file holds another CA", c.baseURL)
	case errors.As(err, &hostErr):
		return fmt.Errorf("kmirror at %s presents a certificate that is not valid for that host (%v): use a host name the certificate holds in --server", c.baseURL, err)
	case strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("kmirror at %s serves plain HTTP: use http:// in --server", c.baseURL)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("cannot reach kmirror at %s: is the daemon running? (set --server or KMIRROR_SERVER; several members may be listed, separated by commas)", c.baseURL)
	case ctx.Err() != nil:
		return fmt.Errorf("request to kmirror at %s: %w", c.baseURL, ctx.Err())
	case notHTTP(err):
		return fmt.Errorf("%s answered without an HTTP reply (%v): it is not a kmirror HTTP address; "+
			"point --server at a member's http_listen address, not a Kafka or raft port", c.baseURL, err)
	case errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Errorf("kmirror at %s did not answer within %s: check that the daemon is healthy (GET /readyz)", c.baseURL, c.http.Timeout)
	default:
		return fmt.Errorf("request to kmirror at %s failed: %w", c.baseURL, err)
	}
}

// Members implements Service.
func (c *Client) Members(ctx context.Context) ([]MemberStatus, error) {
	var out []MemberStatus
	if err := c.do(ctx, http.MethodGet, "/v1/members", nil, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// AddMember implements Service.
func (c *Client) AddMember(ctx context.Context, req AddMemberRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/members", nil, req, nil)
}

// RemoveMember implements Service.
func (c *Client) RemoveMember(ctx context.Context, id string) error {
	path, err := apiPath("/v1/members/{}", id)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, path, nil, nil, nil)
}

// DrainMember implements Service.
func (c *Client) DrainMember(ctx context.Context, id string, drain bool) error {
	path, err := apiPath("/v1/members/{}/drain", id)
	if err != nil {
		return err
	}
	method := http.MethodPost
	if !drain {
		method = http.MethodDelete
	}
	return c.do(ctx, method, path, nil, nil, nil)
}

// AlterMirror implements Service.
func (c *Client) AlterMirror(ctx context.Context, req CreateMirrorRequest) error {
	return c.do(ctx, http.MethodPut, "/v1/mirrors/"+url.PathEscape(req.Name), nil, req, nil)
}

// SetTopicPatterns implements Service.
func (c *Client) SetTopicPatterns(ctx context.Context, req PatternsRequest) (AddResult, error) {
	path, err := apiPath("/v1/mirrors/{}/patterns", req.Mirror)
	if err != nil {
		return AddResult{}, err
	}
	cl := *c
	cl.http = &http.Client{Timeout: max(c.http.Timeout, AddTimeout(discoveryTopicsBound)), Transport: c.http.Transport}
	var res AddResult
	err = cl.do(ctx, http.MethodPut, path, nil, req, &res)
	return res, err
}

// discoveryTopicsBound is how many topics a pattern change's client
// waits for the discovery to add (the add goes on past a client that
// gives up; describe shows it).
const discoveryTopicsBound = 100

// DescribeGroups implements Service.
func (c *Client) DescribeGroups(ctx context.Context, mirror string) ([]GroupStatus, error) {
	query := url.Values{}
	if mirror != "" {
		query.Set("mirror", mirror)
	}
	var rows []GroupStatus
	if err := c.do(ctx, http.MethodGet, "/v1/groups", query, nil, &rows); err != nil {
		return nil, err
	}
	return rows, nil
}
