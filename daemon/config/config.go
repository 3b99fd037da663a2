package config

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/ksec"
)

// Config is a member's configuration, read from the YAML file given to
// `kmirror daemon --config`. Start from DefaultConfig (Load does) so
// that omitted fields keep their defaults.
type Config struct {
	// NodeID names this member in the raft group; it must stay the same
	// across restarts.
	NodeID string `yaml:"node_id"`
	// DataDir holds the raft log, stable store and snapshots.
	DataDir string `yaml:"data_dir"`
	// HTTPListen serves the admin API, /healthz, /readyz and /metrics.
	HTTPListen string `yaml:"http_listen"`
	// RaftListen is where the raft transport listens.
	RaftListen string `yaml:"raft_listen"`
	// RaftAdvertise is the raft address other members dial; defaults to
	// RaftListen.
	RaftAdvertise string `yaml:"raft_advertise"`
	// Peers lists every member of the group, this one included, with the
	// same list on every member. Empty: a group of this member alone. A
	// new group bootstraps once a quorum of the listed voters is up.
	Peers       []PeerConfig      `yaml:"peers"`
	Destination DestinationConfig `yaml:"destination"`
	// MemoryBudget bounds the bytes of fetched and not yet produced batches.
	MemoryBudget ByteSize `yaml:"memory_budget"`
	// TranslationMaxBytes bounds the memory of each held partition's
	// offset-translation breakpoints (fetch.Translation.SetLimit): past
	// it the oldest are dropped, and offsets below them are reported as
	// not translatable (issue 18: a transactional or compacted topic's
	// breakpoints otherwise grow without end).
	TranslationMaxBytes ByteSize      `yaml:"translation_max_bytes"`
	LogLevel            string        `yaml:"log_level"`
	CheckpointInterval  time.Duration `yaml:"checkpoint_interval"`
	// LeaseTTL is how long the leader waits before it reassigns the
	// partitions of a member it cannot reach.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// LeaseMargin is how much earlier than LeaseTTL a member that has not
	// heard from the leader stops writing (self-fencing, design.md section
	// 3): it writes only while its last contact is within LeaseTTL -
	// LeaseMargin.
	LeaseMargin time.Duration `yaml:"lease_margin"`
	// ProduceTimeout bounds each produce request to the destination (the
	// broker's replication wait); it must be below LeaseMargin so a member
	// that stopped writing has nothing in flight when its lease ends.
	ProduceTimeout time.Duration `yaml:"produce_timeout"`
	// ProduceWindow is how many produce requests may await their answers
	// on one destination connection, so how many batches of a partition
	// may be in flight (1..5, fetch.Config.ProduceWindow; 5, the
	// idempotent producer's limit, by default).
	ProduceWindow int `yaml:"produce_window"`
	// HooksDir holds the executables a mirror's failover.hook.exec may
	// name (issue 22: the API chooses among commands an administrator
	// installed, it cannot run any command); the same files on every
	// member, since the raft leader runs them.
	HooksDir string `yaml:"hooks_dir"`
	// API secures the HTTP API: TLS and a bearer token.
	API APIConfig `yaml:"api"`
	// Raft secures the raft transport with mutual TLS.
	Raft RaftTLSConfig `yaml:"raft_tls"`
	// TestHooks enables fault injection for tests: POST
	// /v1/internal/test/raft-isolation?on=true|false cuts this member's raft
	// traffic while its Kafka connections stay up. Never set it in
	// production.
	TestHooks bool `yaml:"test_hooks"`
}

// PeerConfig is one member of the group as every member's config lists it.
type PeerConfig struct {
	ID   string `yaml:"id"`
	Raft string `yaml:"raft"` // raft address other members dial
	HTTP string `yaml:"http"` // HTTP address of the admin API
	// Voter is true by default; false adds capacity without a vote.
	Voter *bool `yaml:"voter"`
}

// IsVoter reports whether the peer votes (the default).
func (p PeerConfig) IsVoter() bool { return p.Voter == nil || *p.Voter }

// DestinationConfig is the connection to the cluster the mirrors write to,
// which also holds kmirror's internal topics.
type DestinationConfig struct {
	BootstrapServers []string `yaml:"bootstrap_servers"`
	// ClientID defaults to "kmirror-<node_id>".
	ClientID string `yaml:"client_id"`
	// ReplicationFactor of the topics kmirror creates; -1 = broker default.
	ReplicationFactor int16 `yaml:"replication_factor"`
	// Principal is the principal the destination's authorizer knows
	// kmirror by, left out of the DENY WRITE ACLs that keep mirror topics
	// read-only. Default: derived as the broker's default principal
	// builder does (User:<SASL user>, or User:<certificate subject>); set
	// it when the brokers map principals (ssl.principal.mapping.rules).
	Principal string `yaml:"principal"`
	// Security holds the Java client's security properties under their own
	// names (security.protocol, ssl.*, sasl.*; see package ksec), as keys
	// of the destination section.
	Security map[string]string `yaml:",inline"`
}

// SecuritySettings checks the destination's security properties; an
// unknown key is an error naming it and the keys allowed.
func (d DestinationConfig) SecuritySettings() (ksec.Settings, error) {
	var unknown []string
	for k := range d.Security {
		if !ksec.IsKey(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		for i, k := range unknown {
			unknown[i] = fmt.Sprintf("%q", "destination."+k)
		}
		return ksec.Settings{}, fmt.Errorf("unknown field %s (%s)", strings.Join(unknown, ", "), destinationKeys())
	}
	return ksec.Parse(d.Security, "destination")
}

// Defaults that DefaultConfig fills in.
const (
	DefaultHTTPListen         = "127.0.0.1:8080"
	DefaultRaftListen         = "127.0.0.1:7080"
	DefaultMemoryBudget       = 256 * MiB
	DefaultTranslationMax     = 16 * MiB
	DefaultLogLevel           = "info"
	DefaultCheckpointInterval = time.Second
	DefaultLeaseTTL           = 10 * time.Second
	DefaultLeaseMargin        = 4 * time.Second
	DefaultProduceTimeout     = 2 * time.Second
	DefaultProduceWindow      = 5
	DefaultHooksDir           = "/etc/kmirror/hooks"
)

// MinLeaseWindow is the least write window (lease_ttl - lease_margin) a
// member accepts: 2 s, twenty runs of its 100 ms lease check (issue 19:
// lease_ttl 3.1s with lease_margin 3.0s was accepted and fenced every
// tick).
const MinLeaseWindow = 2 * time.Second

// MaxLeaseTTL is the longest lease_ttl accepted: a member's partitions
// stand still that long after it dies, so anything longer is a mistake;
// the leader counts no announced lease_ttl beyond it (issue 18: a caller
// naming a member announced 24,000 h, and the member's partitions never
// moved after it was killed).
const MaxLeaseTTL = 5 * time.Minute

// leaderStepDown covers raft's leader lease (500 ms): an isolated leader
// keeps its lease until raft steps it down, then its fence clock starts.
const leaderStepDown = time.Second

// logLevels are the accepted log_level values, in the order shown in errors.
var logLevels = []string{"debug", "info", "warn", "error"}

// DefaultConfig returns the defaults of every field that has one. NodeID,
// DataDir and Destination.BootstrapServers have none; RaftAdvertise and
// Destination.ClientID are derived by ApplyDefaults.
func DefaultConfig() Config {
	return Config{
		HTTPListen:          DefaultHTTPListen,
		RaftListen:          DefaultRaftListen,
		Destination:         DestinationConfig{ReplicationFactor: -1},
		MemoryBudget:        DefaultMemoryBudget,
		TranslationMaxBytes: DefaultTranslationMax,
		LogLevel:            DefaultLogLevel,
		CheckpointInterval:  DefaultCheckpointInterval,
		LeaseTTL:            DefaultLeaseTTL,
		LeaseMargin:         DefaultLeaseMargin,
		ProduceTimeout:      DefaultProduceTimeout,
		ProduceWindow:       DefaultProduceWindow,
		HooksDir:            DefaultHooksDir,
		API:                 APIConfig{OpenRoutes: append([]string(nil), openableRoutes...)},
	}
}

// ApplyDefaults fills the fields whose defaults derive from other fields,
// where they are empty.
func (c *Config) ApplyDefaults() {
	for _, p := range c.Peers {
		if p.ID == c.NodeID && c.RaftAdvertise == "" {
			c.RaftAdvertise = p.Raft
		}
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftListen
	}
	if c.Destination.ClientID == "" && c.NodeID != "" {
		c.Destination.ClientID = "kmirror-" + c.NodeID
	}
}
