package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/truncate"
)

// fakeAPI records calls and answers with canned values; it tests the HTTP
// layer only.
type fakeAPI struct {
	mu       sync.Mutex
	calls    []string
	err      error // returned by every method but Ready
	readyErr error
	mirrors  []api.MirrorSummary
	rows     []api.PartitionStatus
}

func (f *fakeAPI) record(format string, args ...any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
	return f.err
}

func (f *fakeAPI) lastCall() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return ""
	}
	return f.calls[len(f.calls)-1]
}

func (f *fakeAPI) CreateMirror(_ context.Context, req api.CreateMirrorRequest) error {
	return f.record("CreateMirror %s %v", req.Name, req.Properties)
}

func (f *fakeAPI) DeleteMirror(_ context.Context, name string, force bool) error {
	return f.record("DeleteMirror %s force=%t", name, force)
}

func (f *fakeAPI) AddTopics(_ context.Context, req api.AddTopicsRequest) (api.AddResult, error) {
	return api.AddResult{Status: "added"}, f.record("AddTopics %s %v from=%s rf=%d", req.Mirror, req.Topics, req.StartFrom, req.ReplicationFactor)
}

func (f *fakeAPI) RemoveTopic(_ context.Context, mirror, topic string) error {
	return f.record("RemoveTopic %s %s", mirror, topic)
}

func (f *fakeAPI) ListMirrors(context.Context) ([]api.MirrorSummary, error) {
	if err := f.record("ListMirrors"); err != nil {
		return nil, err
	}
	return f.mirrors, nil
}

func (f *fakeAPI) Describe(_ context.Context, mirror, topic string) ([]api.PartitionStatus, error) {
	if err := f.record("Describe mirror=%s topic=%s", mirror, topic); err != nil {
		return nil, err
	}
	return f.rows, nil
}

func (f *fakeAPI) Verify(_ context.Context, req api.VerifyRequest) ([]api.VerifyPartition, error) {
	return nil, nil
}

func (f *fakeAPI) Translate(_ context.Context, mirror, topic string, partition int32, offset int64) (api.Translation, error) {
	return api.Translation{Mirror: mirror, Topic: topic, Partition: partition, SourceOffset: offset, DestinationOffset: offset + 1}, nil
}

func (f *fakeAPI) Members(context.Context) ([]api.MemberStatus, error) {
	return []api.MemberStatus{{ID: "n1", Role: "leader", State: "alive"}}, f.record("members")
}

func (f *fakeAPI) AddMember(_ context.Context, req api.AddMemberRequest) error {
	return f.record("add-member %s %s %s %t", req.ID, req.RaftAddr, req.HTTPAddr, req.NonVoter)
}

func (f *fakeAPI) RemoveMember(_ context.Context, id string) error {
	return f.record("remove-member %s", id)
}

func (f *fakeAPI) DrainMember(_ context.Context, id string, drain bool) error {
	return f.record("drain-member %s %t", id, drain)
}

func (f *fakeAPI) ResumePartitions(_ context.Context, req api.ResumeRequest) ([]int32, error) {
	return req.Partitions, f.record("resume %s %s %v %t", req.Mirror, req.Topic, req.Partitions, req.AcceptGap)
}

func (f *fakeAPI) SwitchoverTopic(_ context.Context, mirror, topic string, timeout time.Duration) ([]string, error) {
	return nil, f.record("SwitchoverTopic %s %s %s", mirror, topic, timeout)
}

func (f *fakeAPI) PlanTopics(_ context.Context, req api.AddTopicsRequest) ([]truncate.Plan, error) {
	return []truncate.Plan{{Mirror: req.Mirror, Topic: "orders", Kind: truncate.KindFailback, From: "east-old",
			Partitions: []truncate.PartitionPlan{{Partition: 0, SourceOffset: 40, DestinationOffset: 50, DestinationEnd: 53, DivergentFrom: 50, Divergent: 3, Reason: "written after"}}}},
		f.record("PlanTopics %s %v", req.Mirror, req.Topics)
}

func (f *fakeAPI) PauseTopics(_ context.Context, mirror, topic string) ([]string, error) {
	return []string{"orders"}, f.record("PauseTopics %s %s", mirror, topic)
}

func (f *fakeAPI) UnpauseTopics(_ context.Context, mirror, topic string) ([]string, error) {
	return []string{"orders"}, f.record("UnpauseTopics %s %s", mirror, topic)
}

func (f *fakeAPI) SetTopicPatterns(_ context.Context, req api.PatternsRequest) (api.AddResult, error) {
	f.record("SetTopicPatterns %s %v %v %v", req.Mirror, req.Include, req.Exclude, req.Remove)
	return api.AddResult{Status: "altered"}, nil
}

func (f *fakeAPI) AlterMirror(_ context.Context, req api.CreateMirrorRequest) error {
	return f.record("alter %s %v", req.Name, req.Properties)
}

func (f *fakeAPI) DescribeGroups(_ context.Context, mirror string) ([]api.GroupStatus, error) {
	return testGroupRows, f.record("groups %s", mirror)
}

func (f *fakeAPI) Ready(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyErr
}

var (
	testMirrors   = []api.MirrorSummary{{Name: "a", Topics: []string{"t1", "t2"}, Bootstrap: []string{"a1:9092"}, State: "MIRRORING"}}
	testGroupRows = []api.GroupStatus{{Mirror: "a", Group: "g", Topic: "t1", Partition: 0, SourceCommitted: 5, DestinationCommitted: 4, State: api.GroupSynced, Member: "m1"}}
	testRows      = []api.PartitionStatus{{Mirror: "a", Topic: "t1", Partition: 0, SourceOffset: 10, DestinationOffset: 8, Lag: 2, State: "MIRRORING", Owner: "m1"}}
)

func newTestHandler(t *testing.T, f *fakeAPI) http.Handler {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "kmirror_up 1\n")
	})
	return NewHandler(f, zaptest.NewLogger(t), metrics)
}

func serve(h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, r))
	return rec
}

func TestRoutes(t *testing.T) {
	tests := []struct {
		name, method, target, body string
		status                     int
		reply                      string // exact JSON reply
		call                       string // call the API saw, "" for none
	}{
		{"create", "POST", "/v1/mirrors", `{"name":"a","properties":{"bootstrap.servers":"a1:9092"}}`,
			201, `{"status":"created"}`, "CreateMirror a map[bootstrap.servers:a1:9092]"},
		{"delete", "DELETE", "/v1/mirrors/a", "", 200, `{"status":"deleted"}`, "DeleteMirror a force=false"},
		{"delete forced", "DELETE", "/v1/mirrors/a?force=true", "", 200, `{"status":"deleted"}`, "DeleteMirror a force=true"},
		{"delete escaped name", "DELETE", "/v1/mirrors/a%2Fb", "", 200, `{"status":"deleted"}`, "DeleteMirror a/b force=false"},
		{"list", "GET", "/v1/mirrors", "", 200,
			`[{"name":"a","topics":["t1","t2"],"bootstrap":["a1:9092"],"state":"MIRRORING"}]`, "ListMirrors"},
		{"add topics", "POST", "/v1/mirrors/a/topics", `{"topics":["t1","t2"],"start_from":"latest","replication_factor":3}`,
			200, `{"status":"added"}`, "AddTopics a [t1 t2] from=latest rf=3"},
		{"add topics with matching mirror", "POST", "/v1/mirrors/a/topics", `{"mirror":"a","topics":["t1"]}`,
			200, `{"status":"added"}`, "AddTopics a [t1] from= rf=0"},
		{"remove topic", "DELETE", "/v1/mirrors/a/topics/t1", "", 200, `{"status":"removed"}`, "RemoveTopic a t1"},
		{"describe all", "GET", "/v1/describe", "", 200,
			`[{"mirror":"a","topic":"t1","partition":0,"source_offset":10,"destination_offset":8,"lag":2,"state":"MIRRORING","owner":"m1","time_lag_ms":0,"records_per_sec":0,"bytes_per_sec":0,"bytes_left":0,"eta_seconds":0}]`,
			"Describe mirror= topic="},
		{"describe filtered", "GET", "/v1/describe?mirror=a&topic=t1", "", 200, "", "Describe mirror=a topic=t1"},
		{"healthz", "GET", "/healthz", "", 200, `{"status":"ok"}`, ""},
		{"readyz", "GET", "/readyz", "", 200, `{"status":"ok"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAPI{mirrors: testMirrors, rows: testRows}
			rec := serve(newTestHandler(t, f), tt.method, tt.target, tt.body)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d; body %s", rec.Code, tt.status, rec.Body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if tt.reply != "" && strings.TrimSpace(rec.Body.String()) != tt.reply {
				t.Errorf("reply %s\nwant  %s", rec.Body, tt.reply)
			}
			if got := f.lastCall(); got != tt.call {
				t.Errorf("call %q, want %q", got, tt.call)
			}
		})
	}
}

func TestEmptyListsAreArrays(t *testing.T) {
	h := newTestHandler(t, &fakeAPI{})
	for _, target := range []string{"/v1/mirrors", "/v1/describe"} {
		if rec := serve(h, "GET", target, ""); strings.TrimSpace(rec.Body.String()) != "[]" {
			t.Errorf("GET %s = %s, want []", target, rec.Body)
		}
	}
}

func TestMetrics(t *testing.T) {
	rec := serve(newTestHandler(t, &fakeAPI{}), "GET", "/metrics", "")
	if rec.Code != 200 || rec.Body.String() != "kmirror_up 1\n" {
		t.Errorf("GET /metrics = %d %q", rec.Code, rec.Body)
	}
	rec = serve(NewHandler(&fakeAPI{}, zaptest.NewLogger(t), nil), "GET", "/metrics", "")
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET /metrics without a metrics handler = %d, want 404", rec.Code)
	}
}

func TestReadyzNotReady(t *testing.T) {
	f := &fakeAPI{readyErr: fmt.Errorf("destination cluster: %w: dial tcp b1:9092: connection refused", api.ErrUnavailable)}
	rec := serve(newTestHandler(t, f), "GET", "/readyz", "")
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", rec.Code)
	}
	want := `{"error":"destination cluster: dependency unavailable: dial tcp b1:9092: connection refused","code":"unavailable"}`
	if strings.TrimSpace(rec.Body.String()) != want {
		t.Errorf("reply %s\nwant  %s", rec.Body, want)
	}
	// healthz stays 200: the process is alive.
	if rec := serve(newTestHandler(t, f), "GET", "/healthz", ""); rec.Code != 200 {
		t.Errorf("healthz %d while not ready", rec.Code)
	}
}

func TestErrorStatus(t *testing.T) {
	tests := []struct {
		err    error
		status int
		code   string
	}{
		{fmt.Errorf("mirror %q: %w", "a", api.ErrNotFound), 404, "not_found"},
		{fmt.Errorf("mirror %q: %w", "a", api.ErrExists), 409, "exists"},
		{fmt.Errorf("topic t1 is STOPPING: %w", api.ErrConflict), 409, "conflict"},
		{fmt.Errorf("%w: topic name %q", api.ErrInvalid, "a b"), 400, "invalid"},
		{fmt.Errorf("%w: leader is m2", api.ErrNotLeader), 503, "not_leader"},
		{fmt.Errorf("source cluster: %w", api.ErrUnavailable), 502, "unavailable"},
		{errors.New("disk full"), 500, ""},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			rec := serve(newTestHandler(t, &fakeAPI{err: tt.err}), "DELETE", "/v1/mirrors/a", "")
			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			var body api.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if body != (api.ErrorBody{Error: tt.err.Error(), Code: tt.code}) {
				t.Errorf("body %+v", body)
			}
		})
	}
}

func TestBadRequests(t *testing.T) {
	tests := []struct {
		name, method, target, body string
		status                     int
		message                    string
	}{
		{"unknown field", "POST", "/v1/mirrors", `{"name":"a","propertes":{}}`, 400,
			`invalid request: request body has unknown field "propertes" (allowed: name, properties)`},
		{"unknown field in add", "POST", "/v1/mirrors/a/topics", `{"topics":["t"],"startFrom":"latest"}`, 400,
			`request body has unknown field "startFrom" (allowed: mirror, topics, start_from, replication_factor, dry_run, truncate, include, exclude)`},
		{"empty body", "POST", "/v1/mirrors", "", 400, "request body is empty"},
		{"malformed", "POST", "/v1/mirrors", `{"name":`, 400, "invalid request: request body: unexpected EOF"},
		{"wrong type", "POST", "/v1/mirrors", `{"name":1}`, 400, "request body: json: cannot unmarshal number"},
		{"two objects", "POST", "/v1/mirrors", `{"name":"a"} {"name":"b"}`, 400, "data after the JSON object"},
		{"trailing brace", "POST", "/v1/mirrors", `{"name":"a"}}`, 400, "data after the JSON object"},
		{"too large", "POST", "/v1/mirrors", `{"name":"` + strings.Repeat("x", maxBodyBytes) + `"}`, 413,
			"request body is larger than 1 MiB"},
		{"mirror mismatch", "POST", "/v1/mirrors/a/topics", `{"mirror":"b","topics":["t"]}`, 400,
			`mirror "b" in the body does not match "a" in the path`},
		{"bad force", "DELETE", "/v1/mirrors/a?force=yes", "", 400, `force="yes": use true or false`},
		{"unknown query parameter", "GET", "/v1/describe?mirorr=a", "", 400,
			`unknown query parameter "mirorr" (allowed: mirror, topic)`},
		{"repeated query parameter", "GET", "/v1/describe?topic=a&topic=b", "", 400, `query parameter "topic" given 2 times`},
		{"query on list", "GET", "/v1/mirrors?name=a", "", 400, `unknown query parameter "name" (allowed: none)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeAPI{}
			rec := serve(newTestHandler(t, f), tt.method, tt.target, tt.body)
			if rec.Code != tt.status {
				t.Errorf("status %d, want %d", rec.Code, tt.status)
			}
			var body api.ErrorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("reply %q: %v", rec.Body, err)
			}
			if !strings.Contains(body.Error, tt.message) || body.Code != "invalid" {
				t.Errorf("reply %+v, want message containing %q and code invalid", body, tt.message)
			}
			if call := f.lastCall(); call != "" {
				t.Errorf("API called: %s", call)
			}
		})
	}
}

func TestUnknownRouteAndMethod(t *testing.T) {
	h := newTestHandler(t, &fakeAPI{})
	if rec := serve(h, "GET", "/v1/nothing", ""); rec.Code != http.StatusNotFound {
		t.Errorf("unknown path: %d", rec.Code)
	}
	if rec := serve(h, "PUT", "/v1/mirrors", ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("wrong method: %d", rec.Code)
	}
}

func newTestClient(t *testing.T, f *fakeAPI) *api.Client {
	srv := httptest.NewServer(newTestHandler(t, f))
	t.Cleanup(srv.Close)
	c, err := api.NewClient(srv.URL+"/", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClientRoundTrip(t *testing.T) {
	f := &fakeAPI{mirrors: testMirrors, rows: testRows}
	c := newTestClient(t, f)
	ctx := context.Background()

	steps := []struct {
		call func() error
		want string
	}{
		{func() error {
			return c.CreateMirror(ctx, api.CreateMirrorRequest{Name: "a", Properties: map[string]string{"bootstrap.servers": "a1:9092"}})
		}, "CreateMirror a map[bootstrap.servers:a1:9092]"},
		{func() error {
			_, err := c.AddTopics(ctx, api.AddTopicsRequest{Mirror: "a", Topics: []string{"t1"}, StartFrom: "latest", ReplicationFactor: 3})
			return err
		}, "AddTopics a [t1] from=latest rf=3"},
		{func() error { return c.RemoveTopic(ctx, "a", "t1") }, "RemoveTopic a t1"},
		{func() error { _, err := c.PauseTopics(ctx, "a", "t1"); return err }, "PauseTopics a t1"},
		{func() error {
			plans, err := c.PlanTopics(ctx, api.AddTopicsRequest{Mirror: "a", Topics: []string{"orders"}})
			if err == nil && (len(plans) != 1 || plans[0].Partitions[0].Divergent != 3) {
				err = fmt.Errorf("PlanTopics = %+v", plans)
			}
			return err
		}, "PlanTopics a [orders]"},
		{func() error { _, err := c.UnpauseTopics(ctx, "a", ""); return err }, "UnpauseTopics a "},
		{func() error { _, err := c.SwitchoverTopic(ctx, "a", "t1", 90*time.Second); return err }, "SwitchoverTopic a t1 1m30s"},
		{func() error { return c.DeleteMirror(ctx, "a b/c", true) }, "DeleteMirror a b/c force=true"},
		{func() error { return c.DeleteMirror(ctx, "a", false) }, "DeleteMirror a force=false"},
		{func() error {
			got, err := c.ListMirrors(ctx)
			if err == nil && !reflect.DeepEqual(got, testMirrors) {
				err = fmt.Errorf("ListMirrors = %+v", got)
			}
			return err
		}, "ListMirrors"},
		{func() error {
			got, err := c.Describe(ctx, "a", "")
			if err == nil && !reflect.DeepEqual(got, testRows) {
				err = fmt.Errorf("Describe = %+v", got)
			}
			return err
		}, "Describe mirror=a topic="},
		{func() error {
			return c.AlterMirror(ctx, api.CreateMirrorRequest{Name: "a", Properties: map[string]string{"groups.include": "g.*"}})
		}, "alter a map[groups.include:g.*]"},
		{func() error {
			got, err := c.DescribeGroups(ctx, "a")
			if err == nil && !reflect.DeepEqual(got, testGroupRows) {
				err = fmt.Errorf("DescribeGroups = %+v", got)
			}
			return err
		}, "groups a"},
	}
	for i, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := f.lastCall(); got != s.want {
			t.Errorf("step %d: server saw %q, want %q", i, got, s.want)
		}
	}
	if err := c.Ready(ctx); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

func TestClientErrors(t *testing.T) {
	ctx := context.Background()
	for _, sentinel := range []error{api.ErrNotFound, api.ErrExists, api.ErrConflict, api.ErrInvalid, api.ErrNotLeader, api.ErrUnavailable} {
		serverErr := fmt.Errorf("mirror %q: %w", "a", sentinel)
		c := newTestClient(t, &fakeAPI{err: serverErr})
		err := c.DeleteMirror(ctx, "a", false)
		if !errors.Is(err, sentinel) {
			t.Errorf("%v: client error %v does not wrap it", sentinel, err)
		}
		if err == nil || err.Error() != serverErr.Error() {
			t.Errorf("client error %q, want the server's message %q", err, serverErr)
		}
	}

	// A failed planned switchover comes back as the server's error.
	c0 := newTestClient(t, &fakeAPI{err: fmt.Errorf("%w: not caught up", api.ErrConflict)})
	if _, err := c0.SwitchoverTopic(ctx, "a", "t1", time.Minute); !errors.Is(err, api.ErrConflict) {
		t.Errorf("SwitchoverTopic error %v, want ErrConflict", err)
	}

	// Exists and conflict share 409; the code keeps them apart.
	c := newTestClient(t, &fakeAPI{err: api.ErrExists})
	if err := c.CreateMirror(ctx, api.CreateMirrorRequest{Name: "a"}); errors.Is(err, api.ErrConflict) {
		t.Errorf("ErrExists came back as ErrConflict: %v", err)
	}

	c = newTestClient(t, &fakeAPI{err: errors.New("disk full")})
	if _, err := c.ListMirrors(ctx); err == nil || err.Error() != "disk full" {
		t.Errorf("internal error: %v", err)
	}

	c = newTestClient(t, &fakeAPI{readyErr: errors.New("raft has no leader")})
	if err := c.Ready(ctx); err == nil || err.Error() != "raft has no leader" || errors.Is(err, api.ErrNotLeader) {
		t.Errorf("Ready: %v", err)
	}

	if err := c.RemoveTopic(ctx, "a", ""); !errors.Is(err, api.ErrInvalid) {
		t.Errorf("empty topic: %v", err)
	}
}

func TestClientNonJSONReply(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	c, err := api.NewClient(srv.URL, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = c.RemoveTopic(context.Background(), "a", "t1")
	if !errors.Is(err, api.ErrNotFound) {
		t.Errorf("error %v does not wrap ErrNotFound", err)
	}
	want := "DELETE /v1/mirrors/a/topics/t1: 404 Not Found: 404 page not found (the daemon may run an older kmirror version than this CLI)"
	if err == nil || err.Error() != want {
		t.Errorf("error %q\nwant  %q", err, want)
	}
}

func TestClientConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	c, err := api.NewClient(url, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Ready(context.Background())
	want := "cannot reach kmirror at " + url + ": is the daemon running? (set --server or KMIRROR_SERVER; several members may be listed, separated by commas)"
	if err == nil || err.Error() != want {
		t.Errorf("error %q\nwant  %q", err, want)
	}
}

func TestClientTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer srv.Close()
	c, err := api.NewClient(srv.URL, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ListMirrors(context.Background())
	if err == nil || !strings.Contains(err.Error(), "did not answer within 50ms") {
		t.Errorf("error %v", err)
	}
}

func TestNewClientRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://host", "http://"} {
		if _, err := api.NewClient(u, time.Second); err == nil {
			t.Errorf("NewClient(%q) accepted", u)
		}
	}
}

// TestClientTriesTheNextMember: with several servers, a member that cannot
// be reached or answers 503 (no leader, catching up) is skipped; any other
// answer, success or error, is final.
func TestClientTriesTheNextMember(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, api.ErrorBody{Error: "not the raft leader: no leader known", Code: "not_leader"})
	}))
	defer busy.Close()
	good := httptest.NewServer(NewHandler(&fakeAPI{mirrors: testMirrors}, zaptest.NewLogger(t), nil))
	defer good.Close()
	refused := "http://127.0.0.1:1"

	c, err := api.NewClient(refused+","+busy.URL+","+good.URL, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.ListMirrors(context.Background())
	if err != nil || len(got) != 1 || got[0].Name != "a" {
		t.Fatalf("ListMirrors over a refused, a busy and a good member: %+v, %v", got, err)
	}

	c, _ = api.NewClient(busy.URL+","+refused, 5*time.Second)
	_, err = c.ListMirrors(context.Background())
	if !errors.Is(err, api.ErrNotLeader) || !strings.Contains(err.Error(), "no kmirror member could serve the request") {
		t.Fatalf("every member busy or down: %v, want ErrNotLeader naming each", err)
	}

	notFound := httptest.NewServer(NewHandler(&fakeAPI{err: fmt.Errorf("%w: mirror x", api.ErrNotFound)}, zaptest.NewLogger(t), nil))
	defer notFound.Close()
	c, _ = api.NewClient(notFound.URL+","+good.URL, 5*time.Second)
	if err := c.DeleteMirror(context.Background(), "x", false); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a member's real answer must be final: %v", err)
	}
}
