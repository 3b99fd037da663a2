package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestClientSkipsMemberThatDoesNotAnswer: with several servers, a read
// goes on to the next member when the first accepts the connection but
// never answers (frozen, overloaded); a write does not (it may have been
// applied), and fails with the timeout.
func TestClientSkipsMemberThatDoesNotAnswer(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)
	var got []string
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[{"name":"east"}]`))
	}))
	defer healthy.Close()
	c, err := NewClient(hung.URL+","+healthy.URL, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := c.ListMirrors(context.Background())
	if err != nil || len(ms) != 1 || ms[0].Name != "east" {
		t.Fatalf("ListMirrors with the first member frozen: %+v, %v; want the second member's answer", ms, err)
	}
	err = c.DeleteMirror(context.Background(), "east", false)
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("DeleteMirror with the first member frozen: %v; want a timeout, not a retry elsewhere", err)
	}
	if len(got) != 1 || got[0] != "GET /v1/mirrors" {
		t.Fatalf("the healthy member got %q; want only the read", got)
	}
}
