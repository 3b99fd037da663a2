package httpapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
)

// historyAPI is a fakeAPI that keeps lag samples (api.LagHistorian).
type historyAPI struct {
	*fakeAPI
	samples []api.LagSample
}

func (h historyAPI) LagHistory() []api.LagSample { return h.samples }

// TestUIPage: /ui shows every partition with its state (a DIVERGED one
// with its reason, a catching-up one with a progress bar), mirrors,
// members, the latest state changes and one chart per topic drawn from
// the lag samples; with a token, a browser's Basic password is the token,
// and without it the page answers 401 asking for it.
func TestUIPage(t *testing.T) {
	now := time.Now()
	f := &fakeAPI{mirrors: []api.MirrorSummary{{Name: "east", Topics: []string{"orders"}, Bootstrap: []string{"a:9092"}, State: "DIVERGED"}},
		rows: []api.PartitionStatus{
			{Mirror: "east", Topic: "orders", Partition: 0, State: "MIRRORING", SourceOffset: 1000, Lag: 250, TimeLagMs: 4200, EtaSeconds: 7, Owner: "n1"},
			{Mirror: "east", Topic: "orders", Partition: 1, State: "DIVERGED", Reason: "foreign write at destination offset 10 <script>", Lag: -1, TimeLagMs: -1,
				StateSinceMs: now.Add(-time.Minute).UnixMilli(), Failures: 1},
		}}
	h := historyAPI{fakeAPI: f, samples: []api.LagSample{
		{AtMs: now.Add(-30 * time.Second).UnixMilli(), Topics: map[string]api.TopicLag{"east/orders": {Records: 500, TimeLagMs: 9000}}},
		{AtMs: now.Add(-15 * time.Second).UnixMilli(), Topics: map[string]api.TopicLag{"east/orders": {Records: 250, TimeLagMs: 4200}}},
	}}
	dir := t.TempDir()
	auth, err := NewAuth(config.APIConfig{TokenFile: writeTemp(t, dir, "token", "ui-token-0123456789\n")}, "n1", zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(auth.Require(NewHandler(h, zaptest.NewLogger(t), http.NotFoundHandler())))
	defer srv.Close()
	get := func(user, password string, basic bool) (*http.Response, string) {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+"/ui", nil)
		if basic {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	if resp, body := get("", "", false); resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") ||
		!strings.Contains(body, "give it as the password") {
		t.Fatalf("/ui without the token: %d %q %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
	}
	if resp, _ := get("admin", "wrong", true); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/ui with a wrong password: %d", resp.StatusCode)
	}
	resp, page := get("admin", "ui-token-0123456789", true)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ui with the token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		`data-partition="east/orders/0" data-state="MIRRORING"`, `<div style="width:75%">`, "ETA 7 s", "4.2s",
		`data-partition="east/orders/1" data-state="DIVERGED"`, "foreign write at destination offset 10 &lt;script&gt;",
		`<tr data-mirror="east">`, `<tr data-member="n1">`,
		`<svg class="lag-chart" data-topic="east/orders" data-points="2"`, `<polyline class="records" points="0.0,1.0 `,
		`<table id="changes">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("a reason's markup reached the page unescaped")
	}
	// The bearer token works too (curl), and another path's Basic
	// password does not.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ui", nil)
	req.Header.Set("Authorization", "Bearer ui-token-0123456789")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/ui with the bearer token: %v %v", resp, err)
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/v1/mirrors", nil)
	req.SetBasicAuth("admin", "ui-token-0123456789")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/v1/mirrors with Basic: %v %v, want 401 (only /ui takes Basic)", resp, err)
	}
}
