package daemon

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// FuzzParseConfig: any file gives a config or one error line, never a
// panic; an accepted config is valid.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("node_id: m1\ndata_dir: /d\ndestination:\n  bootstrap_servers: [b:9092]\n"))
	f.Add([]byte("node_id: m1\ndata_dir: /d\ndestination:\n  bootstrap_servers: [b:9092]\n  security.protocol: SASL_SSL\n  sasl.mechanism: PLAIN\n" +
		"  sasl.jaas.config: org.apache.kafka.common.security.plain.PlainLoginModule required username=\"u\" password=\"p\";\n"))
	f.Add([]byte("node_id: m1\ndata_dir: /d\napi:\n  open_routes: [/metrics]\nraft_tls:\n  ca_file: /nope\ndestination:\n  bootstrap_servers: [b:9092]\n"))
	f.Add([]byte("peers:\n  - {id: a, raft: 'h:1', http: 'h:2', voter: false}\nmemory_budget: 1GiB\nlease_ttl: 1m\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseConfig(data)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("parseConfig accepted an invalid config: %v", err)
		}
	})
}

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
