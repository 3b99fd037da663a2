package leader

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/raftstore"
)

// TestRunHook: the exec hook gets the event on its standard input and in
// KMIRROR_* variables, a failure names its exit and output, a hung one is
// killed at the timeout, one missing from hooks_dir says where to install
// it; the webhook gets the event as JSON with the ID as Idempotency-Key,
// and a non-2xx answer is a failure that names the status and hides the
// URL's secrets.
func TestRunHook(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "got")
	script := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script("ok", `cat > `+out+`; echo >> `+out+`; echo "$KMIRROR_HOOK_ID $KMIRROR_MIRROR $KMIRROR_TOPICS $KMIRROR_KIND $KMIRROR_ATTEMPT" >> `+out+"\n")
	script("fails", "echo refused by the gateway >&2; exit 3\n")
	script("hangs", "sleep 30\n")
	script("leaves-a-child", "sleep 30 &\nexit 0\n")
	run := raftstore.HookRun{ID: 42, Topics: []string{"a", "b"}, Reason: "automatic failover: source down", StoppedAtMs: 1000,
		Positions: map[string][]raftstore.Position{"a": {{SourceOffset: 7, DestinationOffset: 6}}, "b": {{SourceOffset: 3, DestinationOffset: 3}}}}
	ev := hookEvent("east", run, 2)
	ctx := context.Background()
	if err := runHookOnce(ctx, dir, mirrorprops.Hook{Exec: "ok", Timeout: 5 * time.Second}, ev); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	body, env, _ := strings.Cut(string(got), "\n") // the JSON has no newline; echo's line follows it
	var back HookEvent
	if err := json.Unmarshal([]byte(body), &back); err != nil || back.ID != "east-42" || back.Kind != "automatic" || back.Attempt != 2 ||
		back.Positions["a"][0] != (HookPosition{Partition: 0, SourceOffset: 7, DestinationOffset: 6}) {
		t.Fatalf("exec hook's standard input %q: %+v, %v", body, back, err)
	}
	if strings.TrimSpace(env) != "east-42 east a,b automatic 2" {
		t.Fatalf("exec hook's environment: %q", env)
	}
	for _, tt := range []struct {
		hook mirrorprops.Hook
		want string
	}{
		{mirrorprops.Hook{Exec: "fails", Timeout: 5 * time.Second}, "failover.hook.exec fails: exit status 3; output: refused by the gateway"},
		{mirrorprops.Hook{Exec: "hangs", Timeout: 300 * time.Millisecond}, "failover.hook.exec hangs: no exit within 300ms (failover.hook.timeout.ms): killed"},
		{mirrorprops.Hook{Exec: "missing", Timeout: time.Second}, "is not an executable file on this member: install it in hooks_dir (" + dir + ") on every member"},
	} {
		if err := runHookOnce(ctx, dir, tt.hook, ev); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.hook.Exec, err, tt.want)
		}
	}

	// Exit 0 with a child left holding its output: a success.
	if err := runHookOnce(ctx, dir, mirrorprops.Hook{Exec: "leaves-a-child", Timeout: 5 * time.Second}, ev); err != nil {
		t.Errorf("a hook that exits 0 leaving a child: %v", err)
	}
	// A webhook that cannot be reached: the error hides the URL's token.
	if err := runHookOnce(ctx, dir, mirrorprops.Hook{URL: "http://127.0.0.1:1/switch?token=s3cret", Timeout: time.Second}, ev); err == nil ||
		strings.Contains(err.Error(), "s3cret") {
		t.Errorf("unreachable webhook: %v (want an error without the token)", err)
	}

	var posted []HookEvent
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var e HookEvent
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &e); err != nil || r.Method != http.MethodPost || r.Header.Get("Idempotency-Key") != e.ID ||
			r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("webhook got %s %q with headers %v", r.Method, b, r.Header)
		}
		posted = append(posted, e)
		w.WriteHeader(status)
		io.WriteString(w, "dns switch busy")
	}))
	defer srv.Close()
	if err := runHookOnce(ctx, dir, mirrorprops.Hook{URL: srv.URL + "/switch?token=s3cret", Timeout: 5 * time.Second}, ev); err != nil {
		t.Fatal(err)
	}
	status = http.StatusServiceUnavailable
	err = runHookOnce(ctx, dir, mirrorprops.Hook{URL: srv.URL + "/switch?token=s3cret", Timeout: 5 * time.Second}, ev)
	if err == nil || !strings.Contains(err.Error(), "HTTP 503: dns switch busy") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("webhook answering 503: %v", err)
	}
	if len(posted) != 2 || posted[0].ID != "east-42" || posted[0].Topics[1] != "b" {
		t.Fatalf("webhook got %+v", posted)
	}

	// Both hooks, the webhook failing: the retry runs the webhook alone,
	// not the command that succeeded.
	both := mirrorprops.Hook{Exec: "ok", URL: srv.URL + "/switch", Timeout: 5 * time.Second}
	os.Remove(out)
	succeeded, err := runHook(ctx, dir, both, ev, nil)
	if err == nil || !slices.Equal(succeeded, []string{raftstore.HookExec}) {
		t.Fatalf("exec succeeding, webhook failing: succeeded %v, error %v", succeeded, err)
	}
	status = http.StatusOK
	os.Remove(out)
	succeeded, err = runHook(ctx, dir, both, ev, succeeded)
	if err != nil || !slices.Equal(succeeded, []string{raftstore.HookURL}) || len(posted) != 4 {
		t.Fatalf("retry: succeeded %v, error %v, %d posts", succeeded, err, len(posted))
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Fatalf("the retry ran the exec hook that had succeeded (%v)", err)
	}
}

// TestHookKindAndBackoff: the kind comes from the reasons remove,
// switchover and automatic failover give; the backoff doubles from 1 s up
// to a minute.
func TestHookKindAndBackoff(t *testing.T) {
	for reason, want := range map[string]string{"": "remove", "planned switchover (remove --wait-for-sync)": "switchover",
		"automatic failover: the source cluster of mirror m ...": "automatic", "something else": "other"} {
		if got := (raftstore.HookRun{Reason: reason}).Kind(); got != want {
			t.Errorf("kind of a run for %q: %s, want %s", reason, got, want)
		}
	}
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 6: 32 * time.Second, 7: time.Minute, 50: time.Minute} {
		if got := hookBackoff(n); got != want {
			t.Errorf("hookBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

// TestHookRunStatesAreTheAPIs: the states a run reports (raftstore, which
// cannot import the API) are the ones the API names, which the metrics
// and the CLI's rendering switch on.
func TestHookRunStatesAreTheAPIs(t *testing.T) {
	for _, c := range []struct {
		run  raftstore.HookRun
		want string
	}{
		{raftstore.HookRun{}, api.HookPending},
		{raftstore.HookRun{Attempts: 1}, api.HookRetrying},
		{raftstore.HookRun{Attempts: 1, Succeeded: true, Done: true}, api.HookSucceeded},
		{raftstore.HookRun{Attempts: 3, Done: true}, api.HookFailed},
	} {
		if got := c.run.State(); got != c.want {
			t.Errorf("state of %+v: %q, want %q", c.run, got, c.want)
		}
	}
}

// runHookOnce is runHook with no hook succeeded before.
func runHookOnce(ctx context.Context, dir string, h mirrorprops.Hook, ev HookEvent) error {
	_, err := runHook(ctx, dir, h, ev, nil)
	return err
}
