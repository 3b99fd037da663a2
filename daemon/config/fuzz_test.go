package config

import (
	"strings"
	"testing"
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
