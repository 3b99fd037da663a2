package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Sentinel errors of the admin API. The HTTP layer maps them to status codes
// with errors.Is; every error carries a message that says what was wrong and
// what to do next.
var (
	ErrNotFound    = errors.New("not found")              // 404
	ErrExists      = errors.New("already exists")         // 409
	ErrInvalid     = errors.New("invalid request")        // 400
	ErrConflict    = errors.New("conflict")               // 409
	ErrNotLeader   = errors.New("not the raft leader")    // 503: no leader known, or forwarding met a leader change
	ErrUnavailable = errors.New("dependency unavailable") // 502: source/destination unreachable
	// ErrStale refuses a member's command made under a lease that is no
	// longer current (the partition moved or was renewed).
	ErrStale = errors.New("stale lease") // 409
	// ErrUnauthorized: no or a wrong bearer token (api.token_file).
	ErrUnauthorized = errors.New("unauthorized") // 401
	// ErrRefused: a member cannot start with this config and data_dir
	// (another member's data_dir, a wiped member, peers lists that
	// differ); restarting it as it is cannot help.
	ErrRefused = errors.New("refused to start")
)

// ErrorBody is the JSON body of every error reply. Code names the sentinel
// error so clients can map 409 back to ErrExists or ErrConflict.
type ErrorBody struct {
	Error string `json:"error"`
	Code  string `json:"code,omitempty"`
}

// StatusBody is the JSON body of replies that carry no data.
type StatusBody struct {
	Status string `json:"status"`
	// Notes are what the operator should know about a change that was
	// made (remove --wait-for-sync: groups that needed nothing).
	Notes []string `json:"notes,omitempty"`
}

// errorCodes maps each sentinel error to its HTTP status and the code in
// ErrorBody. Order matters only for errors that wrap more than one.
var errorCodes = []struct {
	err    error
	status int
	code   string
}{
	{ErrNotFound, http.StatusNotFound, "not_found"},
	{ErrExists, http.StatusConflict, "exists"},
	{ErrConflict, http.StatusConflict, "conflict"},
	{ErrInvalid, http.StatusBadRequest, "invalid"},
	{ErrNotLeader, http.StatusServiceUnavailable, "not_leader"},
	{ErrUnavailable, http.StatusBadGateway, "unavailable"},
	{ErrStale, http.StatusConflict, "stale"},
	{ErrUnauthorized, http.StatusUnauthorized, "unauthorized"},
}

// Classify returns the status and code for err; unknown errors are 500
// without a code.
func Classify(err error) (status int, code string) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge, "invalid"
	}
	for _, c := range errorCodes {
		if errors.Is(err, c.err) {
			return c.status, c.code
		}
	}
	return http.StatusInternalServerError, ""
}

// remoteError is an error reply of the admin API.
type remoteError struct {
	msg      string
	sentinel error // nil if the reply names none
}

func (e *remoteError) Error() string { return e.msg }

func (e *remoteError) Unwrap() error { return e.sentinel }

// replyError turns a non-2xx reply into an error with the server's message,
// wrapping the sentinel named by the code of a kmirror error body or, for
// other bodies (proxies, routes an older daemon lacks), guessed from the
// status.
func replyError(req *http.Request, resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body ErrorBody
	if json.Unmarshal(data, &body) == nil && body.Error != "" {
		return &remoteError{msg: body.Error, sentinel: sentinelForCode(body.Code)}
	}
	msg := fmt.Sprintf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	if text := strings.TrimSpace(string(data)); text != "" {
		msg += ": " + text
	}
	if strings.Contains(string(data), "HTTP request to an HTTPS server") {
		msg = fmt.Sprintf("kmirror at %s serves HTTPS (api.tls): use https:// in --server", req.URL.Host)
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		msg += " (the daemon may run an older kmirror version than this CLI)"
	}
	return &remoteError{msg: msg, sentinel: sentinelForStatus(resp.StatusCode)}
}

// sentinelForCode returns the sentinel named by an ErrorBody code, or nil.
func sentinelForCode(code string) error {
	for _, c := range errorCodes {
		if c.code == code {
			return c.err
		}
	}
	return nil
}

// sentinelForStatus guesses the sentinel from the status of a reply that
// is not a kmirror error body. 409 could be ErrExists too; ErrConflict is
// the wider one.
func sentinelForStatus(status int) error {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return ErrInvalid
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusConflict:
		return ErrConflict
	case http.StatusServiceUnavailable:
		return ErrNotLeader
	case http.StatusBadGateway:
		return ErrUnavailable
	}
	return nil
}
