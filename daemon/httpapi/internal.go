package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/kmirror/kmirror/daemon/api"
)

// Internal is what members serve each other under /v1/internal.
type Internal interface {
	ApplyInternal(ctx context.Context, entry []byte) error
	// GrantLease answers a member's lease renewal on the leader; the
	// caller is in ctx (api.CallerOf).
	GrantLease(ctx context.Context) (api.LeaseGrant, error)
	LocalStatuses() []api.LiveStatus
	LocalGroupRows() []api.GroupStatus
	LocalReach() api.Reach
	BlockSource(mirror string, on bool)
	Probe() api.RaftProbe
	// TestHooks reports whether test_hooks is on; BlockSource and
	// SetRaftIsolated are served only then.
	TestHooks() bool
	SetRaftIsolated(on bool) error
}

func (h *handler) raftIsolation(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "on")
	if err != nil {
		return 0, nil, err
	}
	on, err := strconv.ParseBool(q["on"])
	if err != nil {
		return 0, nil, fmt.Errorf("%w: on=%q: use true or false", api.ErrInvalid, q["on"])
	}
	if err := h.internal.SetRaftIsolated(on); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: fmt.Sprintf("raft isolated: %t", on)}, nil
}

func (h *handler) applyInternal(r *http.Request) (int, any, error) {
	var req api.InternalApplyRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := h.internal.ApplyInternal(r.Context(), req.Entry); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: "applied"}, nil
}

func (h *handler) grantLease(r *http.Request) (int, any, error) {
	g, err := h.internal.GrantLease(r.Context())
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, g, nil
}

func (h *handler) localReach(*http.Request) (int, any, error) {
	return http.StatusOK, h.internal.LocalReach(), nil
}

// blockSourceRequest is the body of the block-source test hook.
type blockSourceRequest struct {
	Mirror string `json:"mirror"`
	On     bool   `json:"on"`
}

func (h *handler) blockSource(r *http.Request) (int, any, error) {
	var req blockSourceRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	h.internal.BlockSource(req.Mirror, req.On)
	return http.StatusOK, api.StatusBody{Status: "ok"}, nil
}

func (h *handler) localGroups(*http.Request) (int, any, error) {
	return http.StatusOK, h.internal.LocalGroupRows(), nil
}

func (h *handler) localStatuses(*http.Request) (int, any, error) {
	return http.StatusOK, h.internal.LocalStatuses(), nil
}

// StartingHandler answers while the member forms or joins the group: the
// probe peers need, /healthz, and 503 for everything else.
func StartingHandler(probe func() api.RaftProbe) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/internal/raft", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, probe()) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, api.StatusBody{Status: "ok"})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{
			Error: "this kmirror member is starting: it is forming or joining the raft group (see its log)", Code: "not_leader"})
	})
	return mux
}
