package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kmirror/kmirror/fetch/kafka/ksec"
)

// NodeIDPattern is what a member ID (node_id, peers[].id) may hold: letters,
// digits, dot, underscore and hyphen (it names files and raft servers).
var NodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// Validate reports every invalid field at once, each naming the field and
// what it accepts.
func (c *Config) Validate() error {
	var errs problems
	switch {
	case c.NodeID == "":
		errs.add("node_id", "required (a name for this member that stays the same across restarts, such as kmirror-1)")
	case !NodeIDPattern.MatchString(c.NodeID):
		errs.add("node_id", "%q may only hold letters, digits, '.', '_' and '-'", c.NodeID)
	}
	if c.DataDir == "" {
		errs.add("data_dir", "required (a directory for the raft log and snapshots, such as /var/lib/kmirror)")
	}
	errs.check("http_listen", CheckAddress(c.HTTPListen, true))
	errs.check("raft_listen", CheckAddress(c.RaftListen, true))
	if err := CheckAddress(c.RaftAdvertise, false); err != nil {
		errs.add("raft_advertise", "%v: set it to the host:port other members dial to reach this one (it defaults to raft_listen)", err)
	}
	if len(c.Destination.BootstrapServers) == 0 {
		errs.add("destination.bootstrap_servers", "required (host:port list of the destination cluster)")
	}
	for i, server := range c.Destination.BootstrapServers {
		errs.check(fmt.Sprintf("destination.bootstrap_servers[%d]", i), CheckAddress(server, false))
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
	if c.ProduceWindow < 1 || c.ProduceWindow > DefaultProduceWindow {
		errs.add("produce_window", "%d is not allowed: use 1 to %d (produce requests awaiting answers per destination connection; "+
			"a broker de-duplicates an idempotent producer's last %d batches per partition)", c.ProduceWindow, DefaultProduceWindow, DefaultProduceWindow)
	}
	if c.MemoryBudget < MiB {
		errs.add("memory_budget", "%s is too small: use at least 1MiB, such as 256MiB or 1GiB", c.MemoryBudget)
	}
	if c.TranslationMaxBytes < KiB {
		errs.add("translation_max_bytes", "%s is too small: use at least 1KiB, such as 16MiB", c.TranslationMaxBytes)
	}
	if !contains(logLevels, c.LogLevel) {
		errs.add("log_level", "%q is not one of %s", c.LogLevel, strings.Join(logLevels, ", "))
	}
	if c.CheckpointInterval <= 0 {
		errs.add("checkpoint_interval", "%v is not allowed: use a positive duration such as 1s", c.CheckpointInterval)
	}
	c.validateLease(&errs)
	c.validatePeers(&errs)
	c.API.validate(&errs, c.apiHost())
	c.API.validateExposure(&errs, c.HTTPListen)
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
		if !NodeIDPattern.MatchString(p.ID) {
			errs.add(field+".id", "%q: use letters, digits, '.', '_' and '-' (the peer's node_id)", p.ID)
		}
		if ids[p.ID] {
			errs.add(field+".id", "%q is listed twice", p.ID)
		}
		ids[p.ID] = true
		errs.check(field+".raft", CheckAddress(p.Raft, false))
		errs.check(field+".http", CheckAddress(p.HTTP, false))
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

// SameEndpoint reports whether two host:port addresses name the same
// endpoint: equal, or the same port on hosts that resolve to a common IP
// address (localhost and 127.0.0.1, say). A host that does not resolve
// within 2 s matches only itself.
func SameEndpoint(a, b string) bool {
	if a == b {
		return true
	}
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips := func(h string) []string {
		if ip := net.ParseIP(h); ip != nil {
			return []string{ip.String()}
		}
		addrs, err := net.DefaultResolver.LookupHost(ctx, h)
		if err != nil {
			return nil
		}
		out := make([]string, 0, len(addrs))
		for _, a := range addrs {
			if ip := net.ParseIP(a); ip != nil {
				out = append(out, ip.String())
			}
		}
		return out
	}
	ia := ips(ha)
	for _, x := range ips(hb) {
		if slices.Contains(ia, x) {
			return true
		}
	}
	return false
}

// CheckAddress accepts host:port with a numeric port. Listen addresses may
// leave the host empty (all interfaces) and use port 0 (any free port);
// addresses that others dial may not.
func CheckAddress(addr string, listen bool) error {
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

// CheckLease checks a member's lease settings (design.md section 3, issue
// 19): lease_margin at least produce_timeout + 1 s, a write window
// (lease_ttl - lease_margin) of at least MinLeaseWindow, lease_ttl at most
// MaxLeaseTTL. The error names the setting to change and how.
func CheckLease(leaseTTL, leaseMargin, produceTimeout time.Duration) error {
	var errs problems
	c := Config{LeaseTTL: leaseTTL, LeaseMargin: leaseMargin, ProduceTimeout: produceTimeout}
	c.validateLease(&errs)
	return errs.err()
}

func (c *Config) validateLease(errs *problems) {
	switch {
	case c.ProduceTimeout <= 0:
		errs.add("produce_timeout", "%v is not allowed: use a positive duration such as 2s", c.ProduceTimeout)
	case c.LeaseMargin < c.ProduceTimeout+leaderStepDown:
		errs.add("lease_margin", "%v must be at least produce_timeout (%v) + %v, so a member that stops writing (a leader only once raft steps it down) has no request in flight when its lease ends",
			c.LeaseMargin, c.ProduceTimeout, leaderStepDown)
	case c.LeaseTTL > MaxLeaseTTL:
		errs.add("lease_ttl", "%v is longer than %v: a dead member's partitions would stand still that long; use %v (the default) or less",
			c.LeaseTTL, MaxLeaseTTL, DefaultLeaseTTL)
	case c.LeaseTTL <= c.LeaseMargin:
		errs.add("lease_ttl", "%v must be longer than lease_margin (%v): a member writes only while its last contact with the leader is within lease_ttl - lease_margin", c.LeaseTTL, c.LeaseMargin)
	case c.LeaseTTL-c.LeaseMargin < MinLeaseWindow:
		errs.add("lease_ttl", "%v leaves a write window (lease_ttl - lease_margin) of %v: use at least %v more than lease_margin (%v), such as %v; "+
			"a shorter window lapses between two lease checks and the member stops writing every few ticks",
			c.LeaseTTL, c.LeaseTTL-c.LeaseMargin, MinLeaseWindow, c.LeaseMargin, c.LeaseMargin+MinLeaseWindow)
	}
}
