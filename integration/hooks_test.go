package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/leader"
)

// TestFailoverHooks (issue 22, section 5), on a 3-member group and real
// Kafka:
//   - an exec hook (a script in hooks_dir) runs once for a planned
//     switchover, with the last mirrored positions, which equal the
//     destination's ends;
//   - a webhook that fails twice is retried with the same event ID, and the
//     raft leader killed after the second failure: the new leader goes on
//     from the recorded attempts, and the webhook gets exactly one
//     successful delivery (the third request), none after;
//   - a webhook that always fails is given up after failover.hook.retries
//     and reported (list, describe, /metrics).
func TestFailoverHooks(t *testing.T) {
	hooksDir := t.TempDir()
	execLog := filepath.Join(hooksDir, "events.log")
	script := "#!/bin/sh\n{ cat; echo; } >> " + execLog + "\n"
	if err := os.WriteFile(filepath.Join(hooksDir, "record-failover"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	hooks := &hookServer{failFirst: 2}
	srv := httptest.NewServer(hooks)
	defer srv.Close()

	g := startGroupWith(t, "hk", 3, memberOpts{extra: "hooks_dir: " + hooksDir + "\n"})
	m0 := g.members[0]
	ctx := context.Background()
	mirrors := map[string]map[string]string{
		"hkx": {"failover.hook.exec": "record-failover"},
		"hku": {"failover.hook.url": srv.URL + "/switch?token=s3cret"},
		"hkf": {"failover.hook.url": srv.URL + "/broken", "failover.hook.retries": "1"},
	}
	for name, props := range mirrors {
		props["bootstrap.servers"] = env.src.Bootstrap()
		if err := m0.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: name, Properties: props}); err != nil {
			t.Fatal(err)
		}
		topic := name + "-a"
		if err := env.src.CreateTopic(ctx, topic, 2, 1, nil); err != nil {
			t.Fatal(err)
		}
		produceTo(t, env.src, topic, 2, 100, name)
		addCaughtUp(t, m0, name, topic)
	}

	// Exec hook, planned switchover: one event with the positions.
	if out, errOut, code := cli(t, m0, "remove", "--mirror", "hkx", "--topic", "hkx-a", "--wait-for-sync=60s"); code != 0 {
		t.Fatalf("remove --wait-for-sync: exit %d\n%s%s", code, out, errOut)
	}
	events := waitExecEvents(t, execLog, 1)
	ev := events[0]
	if ev.Kind != "switchover" || ev.Mirror != "hkx" || len(ev.Topics) != 1 || ev.Topics[0] != "hkx-a" || ev.Attempt != 1 {
		t.Fatalf("exec hook event %+v, want one switchover of hkx-a, first attempt", ev)
	}
	dst := readAll(t, env.dst, "hkx-a", 2, true)
	for _, p := range ev.Positions["hkx-a"] {
		if p.SourceOffset != 50 || p.DestinationOffset != int64(len(dst[p.Partition])) {
			t.Fatalf("exec hook position %+v: want source offset 50 and the destination's end %d", p, len(dst[p.Partition]))
		}
	}
	requireHookRun(t, m0, "hkx", api.HookSucceeded, 1, "")
	rows, err := m0.client.Describe(ctx, "hkx", "hkx-a")
	if err != nil || !strings.Contains(rows[0].Reason, "failover hook "+ev.ID+": succeeded") {
		t.Fatalf("describe of the switched-over topic does not show the hook: %+v %v", rows, err)
	}

	// Webhook failing twice, leader killed after the second failure.
	leaderID := g.leaderID(m0)
	if err := m0.client.RemoveTopic(ctx, "hku", "hku-a"); err != nil {
		t.Fatal(err)
	}
	hooks.waitRequests(t, "/switch", 2)
	requireHookRun(t, m0, "hku", api.HookRetrying, 2, "HTTP 503")
	old := g.byID(leaderID)
	old.kill9()
	t.Logf("raft leader %s killed after the webhook's second failure", leaderID)
	var watcher *member
	for _, m := range g.members {
		if m != old {
			watcher = m
		}
	}
	hooks.waitRequests(t, "/switch", 3)
	time.Sleep(5 * time.Second) // a hook run again would be sent by now (backoff 1-4 s)
	reqs := hooks.requests("/switch")
	if len(reqs) != 3 {
		t.Fatalf("the webhook got %d requests, want 3 (two failures, one success): %+v", len(reqs), reqs)
	}
	for i, r := range reqs {
		if r.key != reqs[0].key || r.event.ID != r.key || r.event.Attempt != i+1 || r.event.Kind != "remove" || r.token != "s3cret" {
			t.Fatalf("request %d: %+v; want the same event ID as Idempotency-Key in each, attempts 1, 2, 3, kind remove", i+1, r)
		}
	}
	requireHookRun(t, watcher, "hku", api.HookSucceeded, 3, "")
	old.start()

	// A webhook that always fails: given up after 1 + 1 attempts.
	if err := m0.client.RemoveTopic(ctx, "hkf", "hkf-a"); err != nil {
		t.Fatal(err)
	}
	requireHookRun(t, m0, "hkf", api.HookFailed, 2, "HTTP 500: broken")
	out, _, _ := cli(t, m0, "list")
	if !strings.Contains(out, "hkf: failover hook hkf-") || !strings.Contains(out, "failed after 2 attempts: failover.hook.url "+srv.URL+"/broken: HTTP 500") {
		t.Fatalf("kmirror list does not report the failed hook:\n%s", out)
	}
	if strings.Contains(out, "s3cret") {
		t.Fatalf("kmirror list shows the webhook's token:\n%s", out)
	}
	lead := g.byID(g.leaderID(m0))
	text := metricsText(t, lead)
	if !strings.Contains(text, `kmirror_failover_hook_runs{mirror="hkf",state="failed"} 1`) {
		t.Fatalf("the leader's /metrics does not count the failed hook run:\n%s", grepLines(text, "failover_hook"))
	}
	if len(waitExecEvents(t, execLog, 1)) != 1 {
		t.Fatal("the exec hook ran again")
	}
}

// hookServer is a webhook: it records each request; the first failFirst
// requests to /switch fail with 503, /broken always fails with 500.
type hookServer struct {
	mu        sync.Mutex
	failFirst int
	got       []hookRequest
}

type hookRequest struct {
	path, key, token string
	event            leader.HookEvent
}

func (h *hookServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev leader.HookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		ev.ID = "not JSON: " + string(body) // fails the test's checks
	}
	h.mu.Lock()
	h.got = append(h.got, hookRequest{path: r.URL.Path, key: r.Header.Get("Idempotency-Key"), token: r.URL.Query().Get("token"), event: ev})
	n := len(h.requestsLocked(r.URL.Path))
	h.mu.Unlock()
	switch {
	case r.URL.Path == "/broken":
		http.Error(w, "broken", http.StatusInternalServerError)
	case n <= h.failFirst:
		http.Error(w, "gateway busy", http.StatusServiceUnavailable)
	}
}

func (h *hookServer) requestsLocked(path string) []hookRequest {
	var out []hookRequest
	for _, r := range h.got {
		if r.path == path {
			out = append(out, r)
		}
	}
	return out
}

func (h *hookServer) requests(path string) []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.requestsLocked(path)
}

func (h *hookServer) waitRequests(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for len(h.requests(path)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the webhook %s got %d requests within 90s, want %d", path, len(h.requests(path)), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitExecEvents waits until the exec hook's log holds n events and
// returns them.
func waitExecEvents(t *testing.T, path string, n int) []leader.HookEvent {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var evs []leader.HookEvent
		if f, err := os.Open(path); err == nil {
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var ev leader.HookEvent
				if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
					t.Fatalf("exec hook got %q: %v", sc.Text(), err)
				}
				evs = append(evs, ev)
			}
			f.Close()
		}
		if len(evs) >= n {
			return evs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exec hook ran %d times within 60s, want %d", len(evs), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireHookRun waits until list shows the mirror's latest hook run in
// state with attempts attempts and an error containing errText.
func requireHookRun(t *testing.T, m *member, mirror, state string, attempts int, errText string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last []api.HookRunStatus
	for time.Now().Before(deadline) {
		ms, err := m.client.ListMirrors(context.Background())
		if err == nil {
			for _, mir := range ms {
				if mir.Name == mirror && len(mir.FailoverHooks) > 0 {
					last = mir.FailoverHooks
					r := last[len(last)-1]
					if r.State == state && r.Attempts == attempts && strings.Contains(r.LastError, errText) {
						return
					}
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("mirror %s: hook runs %+v, want the latest %s after %d attempts (error with %q)", mirror, last, state, attempts, errText)
}
