package httpapi

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// FuzzHTTPRequests: any method, path and body to the admin API is
// answered without a panic, and never with a 500 (a bad request is the
// client's fault, and the fake API fails nothing).
func FuzzHTTPRequests(f *testing.F) {
	f.Add("POST", "/v1/mirrors", `{"name":"m1","properties":{"bootstrap.servers":"a:9092"}}`)
	f.Add("PUT", "/v1/mirrors/m1", `{"properties":{"security.protocol":"SSL"}}`)
	f.Add("POST", "/v1/mirrors/m1/topics", `{"topics":["t"],"start_from":"earliest","replication_factor":3}`)
	f.Add("POST", "/v1/mirrors/m1/topics/t/resume", `{"partitions":[0,1],"accept_gap":true}`)
	f.Add("GET", "/v1/translate?mirror=m1&topic=t&partition=0&offset=5", "")
	f.Add("DELETE", "/v1/mirrors/m1/topics/t?wait_for_sync=5s", "")
	f.Add("POST", "/v1/members", `{"id":"m4","raft":"h:1","http":"h:2","voter":true}`)
	f.Add("POST", "/v1/mirrors", `{"name":`)
	h := NewHandler(&fakeAPI{mirrors: testMirrors}, zap.NewNop(), nil)
	f.Fuzz(func(t *testing.T, method, path, body string) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") || len(method) == 0 || strings.ContainsAny(method, " \r\n\t/:()<>@,;\\\"[]?={}") {
			return // not a request line an HTTP server would parse
		}
		if _, err := url.ParseRequestURI(path); err != nil {
			return
		}
		for _, r := range method {
			if r < '!' || r > '~' {
				return
			}
		}
		rec := serve(h, method, path, body)
		if rec.Code >= http.StatusInternalServerError {
			t.Fatalf("%s %s %q: %d %s", method, path, body, rec.Code, rec.Body.String())
		}
	})
}
