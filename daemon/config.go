package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kmirror/kmirror/fetch/ksec"
	"gopkg.in/yaml.v3"
)

// Config is a member's configuration, read from the YAML file given to
// `kmirror daemon --config`. Start from DefaultConfig (LoadConfig does) so
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
	MemoryBudget       ByteSize      `yaml:"memory_budget"`
	LogLevel           string        `yaml:"log_level"`
	CheckpointInterval time.Duration `yaml:"checkpoint_interval"`
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
	DefaultLogLevel           = "info"
	DefaultCheckpointInterval = time.Second
	DefaultLeaseTTL           = 10 * time.Second
	DefaultLeaseMargin        = 4 * time.Second
	DefaultProduceTimeout     = 2 * time.Second
)

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
		HTTPListen:         DefaultHTTPListen,
		RaftListen:         DefaultRaftListen,
		Destination:        DestinationConfig{ReplicationFactor: -1},
		MemoryBudget:       DefaultMemoryBudget,
		LogLevel:           DefaultLogLevel,
		CheckpointInterval: DefaultCheckpointInterval,
		LeaseTTL:           DefaultLeaseTTL,
		LeaseMargin:        DefaultLeaseMargin,
		ProduceTimeout:     DefaultProduceTimeout,
		API:                APIConfig{OpenRoutes: append([]string(nil), openableRoutes...)},
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

// LoadConfig reads the YAML file at path over DefaultConfig, applies the
// derived defaults and validates the result. Unknown fields are errors.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

func parseConfig(data []byte) (Config, error) {
	cfg, err := parseConfigLines(data)
	if err != nil && strings.Contains(err.Error(), "\n") {
		// yaml.v3 quotes a multi-line value as it is: keep every error on
		// one line, as the CLI prints it.
		return Config{}, errors.New(strings.ReplaceAll(err.Error(), "\n", `\n`))
	}
	return cfg, err
}

func parseConfigLines(data []byte) (Config, error) {
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, errors.New("file is empty: set at least node_id, data_dir and destination.bootstrap_servers")
		}
		var typeErr *yaml.TypeError
		if errors.As(err, &typeErr) {
			return Config{}, explainTypeErrors(data, typeErr)
		}
		return Config{}, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("holds more than one YAML document: keep only one")
	}
	cfg.ApplyDefaults()
	if err := unknownDestinationKeys(data, cfg.Destination); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// Validate reports every invalid field at once, each naming the field and
// what it accepts.
func (c *Config) Validate() error {
	var errs problems
	switch {
	case c.NodeID == "":
		errs.add("node_id", "required (a name for this member that stays the same across restarts, such as kmirror-1)")
	case !nodeIDPattern.MatchString(c.NodeID):
		errs.add("node_id", "%q may only hold letters, digits, '.', '_' and '-'", c.NodeID)
	}
	if c.DataDir == "" {
		errs.add("data_dir", "required (a directory for the raft log and snapshots, such as /var/lib/kmirror)")
	}
	errs.check("http_listen", checkAddress(c.HTTPListen, true))
	errs.check("raft_listen", checkAddress(c.RaftListen, true))
	if err := checkAddress(c.RaftAdvertise, false); err != nil {
		errs.add("raft_advertise", "%v: set it to the host:port other members dial to reach this one (it defaults to raft_listen)", err)
	}
	if len(c.Destination.BootstrapServers) == 0 {
		errs.add("destination.bootstrap_servers", "required (host:port list of the destination cluster)")
	}
	for i, server := range c.Destination.BootstrapServers {
		errs.check(fmt.Sprintf("destination.bootstrap_servers[%d]", i), checkAddress(server, false))
	}
	if c.Destination.ClientID == "" && c.NodeID != "" {
		errs.add("destination.client_id", "required (the Kafka client.id kmirror uses on the destination; defaults to kmirror-<node_id>)")
	}
	if ds, err := c.Destination.SecuritySettings(); err != nil {
		errs = append(errs, err.Error())
	} else if _, err := ds.Resolve(); err != nil {
		// The files it names: missing, unreadable or wrong (a key that
		// does not match, a wrong ssl.key.password, an expired
		// certificate) make the config invalid.
		errs = append(errs, err.Error())
	}
	if rf := c.Destination.ReplicationFactor; rf != -1 && rf < 1 {
		errs.add("destination.replication_factor", "%d is not allowed: use -1 (broker default) or 1 or more", rf)
	}
	if c.MemoryBudget < MiB {
		errs.add("memory_budget", "%s is too small: use at least 1MiB, such as 256MiB or 1GiB", c.MemoryBudget)
	}
	if !contains(logLevels, c.LogLevel) {
		errs.add("log_level", "%q is not one of %s", c.LogLevel, strings.Join(logLevels, ", "))
	}
	if c.CheckpointInterval <= 0 {
		errs.add("checkpoint_interval", "%v is not allowed: use a positive duration such as 1s", c.CheckpointInterval)
	}
	switch {
	case c.ProduceTimeout <= 0:
		errs.add("produce_timeout", "%v is not allowed: use a positive duration such as 2s", c.ProduceTimeout)
	case c.LeaseMargin < c.ProduceTimeout+leaderStepDown:
		errs.add("lease_margin", "%v must be at least produce_timeout (%v) + %v, so a member that stops writing (a leader only once raft steps it down) has no request in flight when its lease ends",
			c.LeaseMargin, c.ProduceTimeout, leaderStepDown)
	case c.LeaseTTL <= c.LeaseMargin:
		errs.add("lease_ttl", "%v must be longer than lease_margin (%v): a member writes only while its last contact with the leader is within lease_ttl - lease_margin", c.LeaseTTL, c.LeaseMargin)
	}
	c.validatePeers(&errs)
	c.API.validate(&errs, c.apiHost())
	c.Raft.validate(&errs, c.RaftAdvertise)
	return errs.err()
}

// validatePeers checks the peers list: unique IDs and addresses that can be
// dialed, this member listed with its own raft address.
func (c *Config) validatePeers(errs *problems) {
	if len(c.Peers) == 0 {
		return
	}
	ids, addrs := map[string]bool{}, map[string]string{}
	self, voters := false, 0
	for i, p := range c.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		if !nodeIDPattern.MatchString(p.ID) {
			errs.add(field+".id", "%q: use letters, digits, '.', '_' and '-' (the peer's node_id)", p.ID)
		}
		if ids[p.ID] {
			errs.add(field+".id", "%q is listed twice", p.ID)
		}
		ids[p.ID] = true
		errs.check(field+".raft", checkAddress(p.Raft, false))
		errs.check(field+".http", checkAddress(p.HTTP, false))
		for _, a := range []struct{ kind, addr string }{{"raft", p.Raft}, {"http", p.HTTP}} {
			if other, dup := addrs[a.addr]; dup && a.addr != "" {
				errs.add(field+"."+a.kind, "%s is also %s: every member needs its own raft and HTTP addresses", a.addr, other)
			}
			addrs[a.addr] = fmt.Sprintf("%s's %s address", p.ID, a.kind)
		}
		if p.IsVoter() {
			voters++
		}
		if p.ID == c.NodeID {
			self = true
			if p.Raft != c.RaftAdvertise {
				errs.add(field+".raft", "%q differs from raft_advertise %q: a member's entry must name the raft address it advertises", p.Raft, c.RaftAdvertise)
			}
		}
	}
	if !self && c.NodeID != "" {
		errs.add("peers", "does not list this member (node_id %s): list every member, this one included, with the same list on every member", c.NodeID)
	}
	if voters == 0 {
		errs.add("peers", "lists no voter: at least one member must vote (voter: true is the default)")
	}
}

// checkAddress accepts host:port with a numeric port. Listen addresses may
// leave the host empty (all interfaces) and use port 0 (any free port);
// addresses that others dial may not.
func checkAddress(addr string, listen bool) error {
	if addr == "" {
		return errors.New("required (host:port)")
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return fmt.Errorf("%q: port must be a number from 1 to 65535", addr)
	}
	if listen {
		return nil
	}
	if port == 0 {
		return fmt.Errorf("%q: port must be a number from 1 to 65535", addr)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return fmt.Errorf("%q has no host that can be dialed", addr)
	}
	return nil
}

// problems collects field errors and reports them as one line, so a user
// fixes them all in one go.
type problems []string

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, field+": "+fmt.Sprintf(format, args...))
}

func (p *problems) check(field string, err error) {
	if err != nil {
		p.add(field, "%v", err)
	}
}

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	return errors.New(strings.Join(p, "; "))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// typeErrorLine matches the "line N: " prefix yaml.v3 puts on each message
// of a TypeError.
var typeErrorLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// unknownFieldMessage is yaml.v3's message for a key with no struct field.
var unknownFieldMessage = regexp.MustCompile(`^field (\S+) not found in type `)

// explainTypeErrors rewrites yaml.v3's messages, which name Go types, to name
// the config key on the reported line and what it accepts.
func explainTypeErrors(data []byte, typeErr *yaml.TypeError) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return typeErr
	}
	var errs problems
	for _, msg := range typeErr.Errors {
		m := typeErrorLine.FindStringSubmatch(msg)
		if m == nil {
			errs = append(errs, msg)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		unknown := unknownFieldMessage.FindStringSubmatch(m[2])
		name := ""
		if unknown != nil {
			name = unknown[1]
		}
		keys := keysAtLine(&root, line, name)
		if keys == nil {
			errs = append(errs, msg)
			continue
		}
		path, t := configField(keys)
		switch {
		case unknown != nil:
			field := name
			if path != "" {
				field = path + "." + name
			}
			errs = append(errs, fmt.Sprintf("line %d: unknown field %q (allowed here: %s)",
				line, field, strings.Join(yamlKeys(t), ", ")))
		case path == "":
			errs = append(errs, msg)
		default:
			errs = append(errs, fmt.Sprintf("line %d: %s: %s%s", line, path, m[2], typeHint(t)))
		}
	}
	return errs.err()
}

// keysAtLine returns the keys (and "[i]" sequence indexes) leading to the
// deepest key named name (any key if name is "") whose key or value starts
// on line, or nil if there is none. yaml.v3 reports lines only, so items of
// a one-line flow sequence are told apart only by their parent key.
func keysAtLine(n *yaml.Node, line int, name string) []string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p := keysAtLine(c, line, name); p != nil {
				return p
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			if p := keysAtLine(value, line, name); p != nil {
				return append([]string{key.Value}, p...)
			}
			if (name == "" || key.Value == name) && (key.Line == line || value.Line == line) {
				return []string{key.Value}
			}
		}
	case yaml.SequenceNode:
		if name == "" && itemsOnLine(n, line) > 1 {
			return []string{} // a flow sequence: the item is unknown
		}
		for i, c := range n.Content {
			index := fmt.Sprintf("[%d]", i)
			if p := keysAtLine(c, line, name); p != nil {
				return append([]string{index}, p...)
			}
			if name == "" && c.Line == line {
				return []string{index}
			}
		}
	}
	return nil
}

func itemsOnLine(seq *yaml.Node, line int) int {
	n := 0
	for _, c := range seq.Content {
		if c.Line == line {
			n++
		}
	}
	return n
}

// configField follows keys through Config as far as they name fields and
// returns that part as a path, such as "destination.bootstrap_servers[1]",
// with the Go type found there.
func configField(keys []string) (string, reflect.Type) {
	t := reflect.TypeOf(Config{})
	var path strings.Builder
	for _, key := range keys {
		switch {
		case t.Kind() == reflect.Struct:
			f, ok := yamlField(t, key)
			if !ok {
				return path.String(), t
			}
			if path.Len() > 0 {
				path.WriteByte('.')
			}
			path.WriteString(key)
			t = f.Type
		case t.Kind() == reflect.Slice && strings.HasPrefix(key, "["):
			path.WriteString(key)
			t = t.Elem()
		default:
			return path.String(), t
		}
	}
	return path.String(), t
}

// yamlKeys lists the keys of the struct type t.
func yamlKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if name := yamlName(t.Field(i)); name != "" {
			keys = append(keys, name)
		}
	}
	return keys
}

// typeHint says what a field of type t accepts where yaml.v3's message
// names only the Go type.
func typeHint(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return " (want a duration such as 500ms, 1s or 2m)"
	case reflect.TypeOf(int16(0)):
		return " (want a whole number from -32768 to 32767)"
	case reflect.TypeOf([]string(nil)):
		return " (want a list such as [\"host1:9092\", \"host2:9092\"])"
	}
	return ""
}

func yamlField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if yamlName(t.Field(i)) == name {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}

// ByteSize is a number of bytes. In YAML it is a plain integer or an integer
// with a binary unit: 512KiB, 256MiB, 1GiB, 1TiB (or B).
type ByteSize int64

// Binary units of ByteSize.
const (
	KiB ByteSize = 1 << (10 * (iota + 1))
	MiB
	GiB
	TiB
)

var byteUnits = []struct {
	name string
	size ByteSize
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", 1}}

// ParseByteSize parses a plain integer or an integer with one of the units
// B, KiB, MiB, GiB or TiB, such as "256MiB".
func ParseByteSize(s string) (ByteSize, error) {
	text := strings.TrimSpace(s)
	unit := ByteSize(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(text, u.name) {
			text, unit = strings.TrimSpace(strings.TrimSuffix(text, u.name)), u.size
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q: want a whole number of bytes, optionally with a unit B, KiB, MiB, GiB or TiB, such as 256MiB", s)
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return ByteSize(n) * unit, nil
}

// UnmarshalYAML implements yaml.Unmarshaler. It reports a bad value as a
// yaml.TypeError so LoadConfig can name the key.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a size such as 256MiB", n.Line)}}
	}
	size, err := ParseByteSize(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*b = size
	return nil
}

// String formats b in the largest unit that divides it, such as "256MiB".
func (b ByteSize) String() string {
	for _, u := range byteUnits {
		if b != 0 && b%u.size == 0 {
			return fmt.Sprintf("%d%s", b/u.size, u.name)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}

// unknownDestinationKeys reports the keys of the destination section that
// are neither its own fields nor security properties with their line, as
// yaml.v3 reports unknown fields elsewhere (the section's inline map takes
// any key).
func unknownDestinationKeys(data []byte, d DestinationConfig) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil || len(root.Content) == 0 {
		return nil
	}
	var errs problems
	doc := root.Content[0]
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value != "destination" || doc.Content[i+1].Kind != yaml.MappingNode {
			continue
		}
		sec := doc.Content[i+1]
		for j := 0; j+1 < len(sec.Content); j += 2 {
			k := sec.Content[j]
			if _, ok := d.Security[k.Value]; ok && !ksec.IsKey(k.Value) {
				errs = append(errs, fmt.Sprintf("line %d: unknown field %q (%s)", k.Line, "destination."+k.Value, destinationKeys()))
			}
		}
	}
	return errs.err()
}

// apiHost is the host other members and the CLI reach this member's API
// by: its peers entry's http address, else http_listen's host unless it
// is empty or unspecified ("" when unknown).
func (c *Config) apiHost() string {
	addr := c.HTTPListen
	for _, p := range c.Peers {
		if p.ID == c.NodeID {
			addr = p.HTTP
		}
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		return ""
	}
	return host
}

// destinationKeys names the keys the destination section takes, for
// unknown-key errors.
func destinationKeys() string {
	return "allowed here: bootstrap_servers, client_id, replication_factor, principal and the Kafka client's security properties " +
		strings.Join(ksec.Keys(), ", ")
}
