package config

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kmirror/kmirror/integration/harness"
)

const minimalConfig = `
node_id: m1
data_dir: /var/lib/kmirror
destination:
  bootstrap_servers: ["b1:9092", "b2:9092"]
`

func TestLoadConfigDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kmirror.yaml")
	if err := os.WriteFile(path, []byte(minimalConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		NodeID:        "m1",
		DataDir:       "/var/lib/kmirror",
		HTTPListen:    "127.0.0.1:8080",
		RaftListen:    "127.0.0.1:7080",
		RaftAdvertise: "127.0.0.1:7080",
		Destination: DestinationConfig{
			BootstrapServers:  []string{"b1:9092", "b2:9092"},
			ClientID:          "kmirror-m1",
			ReplicationFactor: -1,
		},
		MemoryBudget:        256 * MiB,
		TranslationMaxBytes: 16 * MiB,
		LogLevel:            "info",
		CheckpointInterval:  time.Second,
		LeaseTTL:            10 * time.Second,
		LeaseMargin:         4 * time.Second,
		ProduceTimeout:      2 * time.Second,
		ProduceWindow:       5,
		HooksDir:            "/etc/kmirror/hooks",
		API:                 APIConfig{OpenRoutes: []string{"/healthz", "/readyz", "/metrics"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseConfigEveryField(t *testing.T) {
	got, err := parseConfig([]byte(`
node_id: m2
data_dir: ./data
http_listen: 0.0.0.0:9000
raft_listen: 0.0.0.0:9001
raft_advertise: 10.0.0.2:9001
peers:
  - {id: m1, raft: "10.0.0.1:9001", http: "10.0.0.1:9000"}
  - {id: m2, raft: "10.0.0.2:9001", http: "10.0.0.2:9000"}
  - {id: m3, raft: "10.0.0.3:9001", http: "10.0.0.3:9000", voter: false}
destination:
  bootstrap_servers: [b1:9092]
  client_id: mirror-b
  replication_factor: 3
memory_budget: 1GiB
translation_max_bytes: 4MiB
log_level: debug
checkpoint_interval: 500ms
lease_ttl: 15s
lease_margin: 5s
produce_timeout: 3s
produce_window: 2
hooks_dir: /opt/kmirror/hooks
api: {insecure: true}
test_hooks: true
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		NodeID:        "m2",
		DataDir:       "./data",
		HTTPListen:    "0.0.0.0:9000",
		RaftListen:    "0.0.0.0:9001",
		RaftAdvertise: "10.0.0.2:9001",
		Peers: []PeerConfig{
			{ID: "m1", Raft: "10.0.0.1:9001", HTTP: "10.0.0.1:9000"},
			{ID: "m2", Raft: "10.0.0.2:9001", HTTP: "10.0.0.2:9000"},
			{ID: "m3", Raft: "10.0.0.3:9001", HTTP: "10.0.0.3:9000", Voter: new(bool)},
		},
		Destination: DestinationConfig{
			BootstrapServers:  []string{"b1:9092"},
			ClientID:          "mirror-b",
			ReplicationFactor: 3,
		},
		MemoryBudget:        GiB,
		TranslationMaxBytes: 4 * MiB,
		LogLevel:            "debug",
		CheckpointInterval:  500 * time.Millisecond,
		LeaseTTL:            15 * time.Second,
		LeaseMargin:         5 * time.Second,
		ProduceTimeout:      3 * time.Second,
		ProduceWindow:       2,
		HooksDir:            "/opt/kmirror/hooks",
		API:                 APIConfig{OpenRoutes: []string{"/healthz", "/readyz", "/metrics"}, Insecure: true},
		TestHooks:           true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

// TestExampleConfigLoads keeps deploy/kmirror.example.yaml in step with Config.
// Its /etc/kmirror files are made in a temporary folder: a certificate for
// the member's API address and a token.
func TestExampleConfigLoads(t *testing.T) {
	data, err := os.ReadFile("../../deploy/kmirror.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca, err := harness.NewCA("api-ca")
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.Issue(harness.CertOptions{CommonName: "kmirror-1", IPs: []net.IP{net.ParseIP("10.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string][]byte{"api.pem": iss.CertPEM, "api-key.pem": iss.KeyPEM, "ca.pem": ca.PEM,
		"api-token": []byte("0123456789abcdef0123456789abcdef\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	local := filepath.Join(dir, "kmirror.yaml")
	if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(data), "/etc/kmirror/", dir+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(local)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.API.TokenFile == "" || cfg.API.TLS.CertFile == "" || cfg.API.Insecure {
		t.Errorf("the example's API is not the secure form (token and TLS): %+v", cfg.API)
	}
	for _, key := range append(yamlKeys(reflect.TypeOf(Config{})), yamlKeys(reflect.TypeOf(DestinationConfig{}))...) {
		if !strings.Contains(string(data), key+":") {
			t.Errorf("example config does not show %s", key)
		}
	}
	if cfg.NodeID == "" {
		t.Error("example config has no node_id")
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"empty", "", []string{"file is empty"}},
		{"missing required", "log_level: info\n", []string{
			"node_id: required",
			"data_dir: required",
			"destination.bootstrap_servers: required (host:port list of the destination cluster)",
		}},
		{"unknown top-level field", minimalConfig + "memory_limit: 1GiB\n", []string{
			`line 6: unknown field "memory_limit" (allowed here: node_id, data_dir,`,
		}},
		{"unknown nested field", minimalConfig + "  acks: all\n", []string{
			`line 6: unknown field "destination.acks" (allowed here: bootstrap_servers, client_id, replication_factor, principal and the Kafka client's security properties`,
		}},
		{"destination keystore missing", minimalConfig + "  security.protocol: SSL\n  ssl.keystore.location: /nonexistent/kmirror.pem\n", []string{
			"destination: ssl.keystore.location: open /nonexistent/kmirror.pem: no such file or directory",
		}},
		{"bad duration", minimalConfig + "lease_ttl: soon\n", []string{
			"line 6: lease_ttl: cannot unmarshal !!str `soon` into time.Duration (want a duration such as 500ms, 1s or 2m)",
		}},
		{"bad size", minimalConfig + "memory_budget: 1GB\n", []string{
			`line 6: memory_budget: invalid size "1GB"`, "KiB, MiB, GiB or TiB",
		}},
		{"produce window a fraction", minimalConfig + "produce_window: 2.5\n", []string{
			"produce_window: 2.5 is not a whole number: use a whole number from 1 to 5",
		}},
		{"produce window too large", minimalConfig + "produce_window: 6\n", []string{
			"produce_window: 6 is not allowed: use 1 to 5",
		}},
		{"size too small", minimalConfig + "memory_budget: 1024\n", []string{
			"memory_budget: 1KiB is too small: use at least 1MiB",
		}},
		{"bootstrap servers not a list", "node_id: m1\ndata_dir: d\ndestination:\n  bootstrap_servers: {a: b}\n", []string{
			"line 4: destination.bootstrap_servers: cannot unmarshal", `(want a list such as ["host1:9092", "host2:9092"])`,
		}},
		{"bad log level", minimalConfig + "log_level: verbose\n", []string{
			`log_level: "verbose" is not one of debug, info, warn, error`,
		}},
		{"bad node id", strings.Replace(minimalConfig, "m1", "m 1", 1), []string{
			`node_id: "m 1" may only hold letters, digits`,
		}},
		{"bad bootstrap server", strings.Replace(minimalConfig, `"b2:9092"`, `"b2"`, 1), []string{
			`destination.bootstrap_servers[1]: "b2" is not host:port`,
		}},
		{"bad listen port", minimalConfig + "http_listen: 127.0.0.1:http\n", []string{
			`http_listen: "127.0.0.1:http": port must be a number from 1 to 65535`,
		}},
		{"unspecified advertise address", minimalConfig + "raft_listen: 0.0.0.0:7080\n", []string{
			`raft_advertise: "0.0.0.0:7080" has no host that can be dialed: set it to the host:port other members dial`,
		}},
		{"replication factor zero", minimalConfig + "  replication_factor: 0\n", []string{
			"destination.replication_factor: 0 is not allowed: use -1 (broker default) or 1 or more",
		}},
		{"zero durations", minimalConfig + "checkpoint_interval: 0s\nlease_ttl: -1s\n", []string{
			"checkpoint_interval: 0s is not allowed", "lease_ttl: -1s must be longer than lease_margin",
		}},
		{"lease window below two seconds", minimalConfig + "lease_ttl: 3.1s\nlease_margin: 3s\n", []string{
			"lease_ttl: 3.1s leaves a write window (lease_ttl - lease_margin) of 100ms: use at least 2s more than lease_margin (3s), such as 5s",
		}},
		{"lease beyond five minutes", minimalConfig + "lease_ttl: 24000h\n", []string{
			"lease_ttl: 24000h0m0s is longer than 5m0s: a dead member's partitions would stand still that long",
		}},
		{"two documents", minimalConfig + "---\nnode_id: m2\n", []string{"more than one YAML document"}},
		{"syntax", "node_id: [\n", []string{"yaml:"}},
		{"duplicate key", minimalConfig + "node_id: m2\n", []string{`"node_id" already defined`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tt.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\ndoes not contain %q", err, want)
				}
			}
		})
	}
}

func TestLoadConfigNamesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kmirror.yaml")
	if err := os.WriteFile(path, []byte("node_id: m1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), "config "+path+": ") {
		t.Errorf("got %v", err)
	}
	_, err = Load(filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("got %v", err)
	}
}

func TestByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want ByteSize
		text string
	}{
		{"0", 0, "0B"},
		{"1000", 1000, "1000B"},
		{"1024", KiB, "1KiB"},
		{"512B", 512, "512B"},
		{"256MiB", 256 * MiB, "256MiB"},
		{"256 MiB", 256 * MiB, "256MiB"},
		{"1536MiB", 1536 * MiB, "1536MiB"},
		{"1GiB", GiB, "1GiB"},
		{"2TiB", 2 * TiB, "2TiB"},
	}
	for _, tt := range tests {
		got, err := ParseByteSize(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
		}
		if got.String() != tt.text {
			t.Errorf("ByteSize(%d).String() = %q, want %q", got, got.String(), tt.text)
		}
	}
	for _, bad := range []string{"", "MiB", "1.5GiB", "-1", "1GB", "1mib", "16777216TiB", "ten"} {
		if _, err := ParseByteSize(bad); err == nil {
			t.Errorf("ParseByteSize(%q) accepted", bad)
		}
	}
}

func TestValidateProgrammaticConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeID = "m1"
	cfg.DataDir = t.TempDir()
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.Destination.BootstrapServers = []string{"localhost:9092"}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Destination.ClientID != "kmirror-m1" || cfg.RaftAdvertise != DefaultRaftListen {
		t.Errorf("derived defaults not applied: %+v", cfg)
	}
}

func TestPeersNeedTheirOwnAddresses(t *testing.T) {
	_, err := parseConfig([]byte(minimalConfig + `peers:
  - {id: m1, raft: "127.0.0.1:7080", http: "h1:8080"}
  - {id: m2, raft: "127.0.0.1:7080", http: "h2:8080"}
`))
	if err == nil || !strings.Contains(err.Error(), `peers[1].raft: 127.0.0.1:7080 is also m1's raft address`) {
		t.Fatalf("two peers on one raft address: %v", err)
	}
}
