package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
)

// maxBodyBytes bounds admin request bodies; real ones are a few KiB.
const maxBodyBytes = 1 << 20

// handler serves the admin API on top of an API implementation.
type handler struct {
	api      api.Service
	internal Internal // nil: no member-to-member routes (tests)
	log      *zap.Logger
}

// apiFunc handles one admin request: it returns the success status and the
// value to encode as JSON, or an error for the wrapper to map.
type apiFunc func(r *http.Request) (int, any, error)

// NewHandler returns the HTTP handler of a member: the admin API under /v1,
// /healthz, /readyz and, if metrics is not nil, /metrics.
func NewHandler(api api.Service, logger *zap.Logger, metrics http.Handler) http.Handler {
	h := &handler{api: api, log: logger.Named("http")}
	h.internal, _ = api.(Internal)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/mirrors", h.wrap(h.createMirror))
	mux.Handle("GET /v1/mirrors", h.wrap(h.listMirrors))
	mux.Handle("DELETE /v1/mirrors/{name}", h.wrap(h.deleteMirror))
	mux.Handle("PUT /v1/mirrors/{name}", h.wrap(h.alterMirror))
	mux.Handle("PUT /v1/mirrors/{name}/patterns", h.wrap(h.setPatterns))
	mux.Handle("POST /v1/mirrors/{name}/pause", h.wrap(h.pause(true)))
	mux.Handle("POST /v1/mirrors/{name}/unpause", h.wrap(h.pause(false)))
	mux.Handle("GET /v1/groups", h.wrap(h.describeGroups))
	mux.Handle("POST /v1/mirrors/{name}/topics", h.wrap(h.addTopics))
	mux.Handle("DELETE /v1/mirrors/{name}/topics/{topic}", h.wrap(h.removeTopic))
	mux.Handle("POST /v1/mirrors/{name}/topics/{topic}/resume", h.wrap(h.resumeTopic))
	mux.Handle("GET /v1/describe", h.wrap(h.describe))
	mux.Handle("GET /v1/translate", h.wrap(h.translate))
	mux.Handle("POST /v1/verify", h.wrap(h.verify))
	mux.Handle("GET /v1/members", h.wrap(h.members))
	mux.Handle("POST /v1/members", h.wrap(h.addMember))
	mux.Handle("DELETE /v1/members/{id}", h.wrap(h.removeMember))
	mux.Handle("POST /v1/members/{id}/drain", h.wrap(h.drainMember))
	mux.Handle("DELETE /v1/members/{id}/drain", h.wrap(h.drainMember))
	if h.internal != nil {
		mux.Handle("POST /v1/internal/apply", h.wrap(h.applyInternal))
		mux.Handle("POST /v1/internal/lease", h.wrap(h.grantLease))
		mux.Handle("GET /v1/internal/status", h.wrap(h.localStatuses))
		mux.Handle("GET /v1/internal/groups", h.wrap(h.localGroups))
		mux.Handle("GET /v1/internal/reach", h.wrap(h.localReach))
		mux.HandleFunc("GET /v1/internal/raft", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, h.internal.Probe()) })
		if h.internal.TestHooks() {
			mux.Handle("POST /v1/internal/test/raft-isolation", h.wrap(h.raftIsolation))
			mux.Handle("POST /v1/internal/test/block-source", h.wrap(h.blockSource))
		}
	}
	mux.HandleFunc("GET /ui", h.ui)
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

// wrap turns an apiFunc into an http.Handler: JSON on success, and errors
// mapped to a status and {"error": ...}.
func (h *handler) wrap(fn apiFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(api.ForwardedHeader) != "" {
			r = r.WithContext(api.WithForwarded(r.Context()))
		}
		status, body, err := fn(r)
		if err == nil {
			writeJSON(w, status, body)
			return
		}
		status, code := api.Classify(err)
		fields := []zap.Field{zap.String("method", r.Method), zap.String("path", r.URL.Path), zap.Int("status", status), zap.Error(err)}
		if status >= 500 {
			h.log.Warn("admin request failed", fields...)
		} else {
			h.log.Debug("admin request rejected", fields...)
		}
		writeJSON(w, status, api.ErrorBody{Error: err.Error(), Code: code})
	})
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status line is sent; an encode error means the client went away.
	_ = json.NewEncoder(w).Encode(body)
}

func (h *handler) createMirror(r *http.Request) (int, any, error) {
	var req api.CreateMirrorRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := h.api.CreateMirror(r.Context(), req); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, api.StatusBody{Status: "created"}, nil
}

func (h *handler) listMirrors(r *http.Request) (int, any, error) {
	if _, err := queryParams(r); err != nil {
		return 0, nil, err
	}
	mirrors, err := h.api.ListMirrors(r.Context())
	if err != nil {
		return 0, nil, err
	}
	if mirrors == nil {
		mirrors = []api.MirrorSummary{}
	}
	return http.StatusOK, mirrors, nil
}

func (h *handler) deleteMirror(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "force")
	if err != nil {
		return 0, nil, err
	}
	force := false
	if v := q["force"]; v != "" {
		if force, err = strconv.ParseBool(v); err != nil {
			return 0, nil, fmt.Errorf("%w: force=%q: use true or false", api.ErrInvalid, v)
		}
	}
	if err := h.api.DeleteMirror(r.Context(), r.PathValue("name"), force); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: "deleted"}, nil
}

func (h *handler) addTopics(r *http.Request) (int, any, error) {
	var req api.AddTopicsRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	name := r.PathValue("name")
	if req.Mirror != "" && req.Mirror != name {
		return 0, nil, fmt.Errorf("%w: mirror %q in the body does not match %q in the path: leave it out of the body", api.ErrInvalid, req.Mirror, name)
	}
	req.Mirror = name
	if req.DryRun {
		plans, err := h.api.PlanTopics(r.Context(), req)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, api.PlanResult{Plans: plans}, nil
	}
	res, err := h.api.AddTopics(r.Context(), req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, res, nil
}

func (h *handler) removeTopic(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "wait_for_sync")
	if err != nil {
		return 0, nil, err
	}
	name, topic := r.PathValue("name"), r.PathValue("topic")
	if w := q["wait_for_sync"]; w != "" {
		d, perr := time.ParseDuration(w)
		if perr != nil || d <= 0 {
			return 0, nil, fmt.Errorf("%w: wait_for_sync=%s: give a positive duration such as 5m", api.ErrInvalid, w)
		}
		var notes []string
		notes, err = h.api.SwitchoverTopic(r.Context(), name, topic, d)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, api.StatusBody{Status: "removed", Notes: notes}, nil
	}
	if err := h.api.RemoveTopic(r.Context(), name, topic); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: "removed"}, nil
}

func (h *handler) resumeTopic(r *http.Request) (int, any, error) {
	var req api.ResumeRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	name, topic := r.PathValue("name"), r.PathValue("topic")
	if (req.Mirror != "" && req.Mirror != name) || (req.Topic != "" && req.Topic != topic) {
		return 0, nil, fmt.Errorf("%w: mirror or topic in the body does not match the path: leave them out of the body", api.ErrInvalid)
	}
	req.Mirror, req.Topic = name, topic
	resumed, err := h.api.ResumePartitions(r.Context(), req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.ResumeResult{Resumed: resumed}, nil
}

func (h *handler) members(r *http.Request) (int, any, error) {
	if _, err := queryParams(r); err != nil {
		return 0, nil, err
	}
	rows, err := h.api.Members(r.Context())
	if err != nil {
		return 0, nil, err
	}
	if rows == nil {
		rows = []api.MemberStatus{}
	}
	return http.StatusOK, rows, nil
}

func (h *handler) addMember(r *http.Request) (int, any, error) {
	var req api.AddMemberRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if err := h.api.AddMember(r.Context(), req); err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, api.StatusBody{Status: "added"}, nil
}

func (h *handler) removeMember(r *http.Request) (int, any, error) {
	if err := h.api.RemoveMember(r.Context(), r.PathValue("id")); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: "removed"}, nil
}

func (h *handler) drainMember(r *http.Request) (int, any, error) {
	drain := r.Method == http.MethodPost
	if err := h.api.DrainMember(r.Context(), r.PathValue("id"), drain); err != nil {
		return 0, nil, err
	}
	if drain {
		return http.StatusOK, api.StatusBody{Status: "draining"}, nil
	}
	return http.StatusOK, api.StatusBody{Status: "not draining"}, nil
}

func (h *handler) describe(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "mirror", "topic")
	if err != nil {
		return 0, nil, err
	}
	rows, err := h.api.Describe(r.Context(), q["mirror"], q["topic"])
	if err != nil {
		return 0, nil, err
	}
	if rows == nil {
		rows = []api.PartitionStatus{}
	}
	return http.StatusOK, rows, nil
}

func (h *handler) alterMirror(r *http.Request) (int, any, error) {
	var req api.CreateMirrorRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if req.Name != "" && req.Name != r.PathValue("name") {
		return 0, nil, fmt.Errorf("%w: the body names mirror %s, the path %s: a mirror cannot be renamed", api.ErrInvalid, req.Name, r.PathValue("name"))
	}
	req.Name = r.PathValue("name")
	if err := h.api.AlterMirror(r.Context(), req); err != nil {
		return 0, nil, err
	}
	return http.StatusOK, api.StatusBody{Status: "altered"}, nil
}

func (h *handler) setPatterns(r *http.Request) (int, any, error) {
	var req api.PatternsRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	name := r.PathValue("name")
	if req.Mirror != "" && req.Mirror != name {
		return 0, nil, fmt.Errorf("%w: mirror %q in the body does not match %q in the path: leave it out of the body", api.ErrInvalid, req.Mirror, name)
	}
	req.Mirror = name
	res, err := h.api.SetTopicPatterns(r.Context(), req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, res, nil
}

func (h *handler) pause(pause bool) apiFunc {
	return func(r *http.Request) (int, any, error) {
		q, err := queryParams(r, "topic")
		if err != nil {
			return 0, nil, err
		}
		call := h.api.UnpauseTopics
		if pause {
			call = h.api.PauseTopics
		}
		topics, err := call(r.Context(), r.PathValue("name"), q["topic"])
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, api.PauseResult{Topics: topics}, nil
	}
}

func (h *handler) describeGroups(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "mirror")
	if err != nil {
		return 0, nil, err
	}
	rows, err := h.api.DescribeGroups(r.Context(), q["mirror"])
	if err != nil {
		return 0, nil, err
	}
	if rows == nil {
		rows = []api.GroupStatus{}
	}
	return http.StatusOK, rows, nil
}

func (h *handler) verify(r *http.Request) (int, any, error) {
	var req api.VerifyRequest
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	res, err := h.api.Verify(r.Context(), req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, res, nil
}

func (h *handler) translate(r *http.Request) (int, any, error) {
	q, err := queryParams(r, "mirror", "topic", "partition", "offset")
	if err != nil {
		return 0, nil, err
	}
	partition, err1 := strconv.ParseInt(q["partition"], 10, 32)
	offset, err2 := strconv.ParseInt(q["offset"], 10, 64)
	if q["mirror"] == "" || q["topic"] == "" || err1 != nil || err2 != nil || partition < 0 || offset < 0 {
		return 0, nil, fmt.Errorf("%w: translate needs mirror, topic, partition and offset (non-negative integers)", api.ErrInvalid)
	}
	res, err := h.api.Translate(r.Context(), q["mirror"], q["topic"], int32(partition), offset)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, res, nil
}

// healthz answers as long as the process serves HTTP; orchestrators restart
// a member only when this fails.
func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.StatusBody{Status: "ok"})
}

// readyz is 503 whenever api.Ready fails, whatever the cause, so load
// balancers take the member out of rotation.
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	if err := h.api.Ready(r.Context()); err != nil {
		_, code := api.Classify(err)
		writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{Error: err.Error(), Code: code})
		return
	}
	writeJSON(w, http.StatusOK, api.StatusBody{Status: "ok"})
}

// decodeBody decodes a JSON object into v, rejecting unknown fields, bodies
// over maxBodyBytes and anything after the object.
func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			return fmt.Errorf("request body is larger than 1 MiB: %w", err)
		case errors.Is(err, io.EOF):
			return fmt.Errorf("%w: request body is empty: send a JSON object", api.ErrInvalid)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			// encoding/json has no typed error for unknown fields.
			field := strings.TrimPrefix(err.Error(), "json: unknown field ")
			return fmt.Errorf("%w: request body has unknown field %s (allowed: %s)", api.ErrInvalid, field, strings.Join(jsonFields(v), ", "))
		default:
			return fmt.Errorf("%w: request body: %v", api.ErrInvalid, err)
		}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: request body has data after the JSON object: send one object", api.ErrInvalid)
	}
	return nil
}

// jsonFields lists the JSON names of the struct v points to.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v).Elem()
	names := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "-" { // an internal field, never decoded
			names = append(names, name)
		}
	}
	return names
}

// queryParams returns the query parameters of r, rejecting any not in
// allowed so that a misspelt filter is not silently ignored.
func queryParams(r *http.Request, allowed ...string) (map[string]string, error) {
	values := make(map[string]string)
	for name, v := range r.URL.Query() {
		if !slices.Contains(allowed, name) {
			allowedText := "none"
			if len(allowed) > 0 {
				allowedText = strings.Join(allowed, ", ")
			}
			return nil, fmt.Errorf("%w: unknown query parameter %q (allowed: %s)", api.ErrInvalid, name, allowedText)
		}
		if len(v) > 1 {
			return nil, fmt.Errorf("%w: query parameter %q given %d times: give it once", api.ErrInvalid, name, len(v))
		}
		values[name] = v[0]
	}
	return values, nil
}
