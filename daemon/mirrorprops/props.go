// Package mirrorprops owns a mirror's properties (the --mirror-config
// file, Kafka .properties syntax): which ones this version understands,
// their defaults and checks (Parse), and how the mirror's source cluster is
// reached from them (Source, SourceKey, SourceAdmin). It must not act on a
// cluster: callers connect.
package mirrorprops

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
)

// Mirror properties (the --mirror-config file, Kafka .properties syntax).
const (
	propBootstrap     = "bootstrap.servers"
	propClientID      = "client.id"
	propGroupsInclude = "groups.include"
	// PropGroupsExclude excludes consumer groups from offset sync.
	PropGroupsExclude  = "groups.exclude"
	propGroupsInterval = "groups.sync.interval"
	propFailoverAuto   = "failover.auto.after.ms"
	// propFetchConns is how many fetch connections kmirror keeps to each
	// source broker (fetch.Source.FetchConnections); unset: sized from
	// the round trip.
	propFetchConns = "fetch.connections"
	// propDiscoveryInterval is how often the leader lists the source's
	// topics for the mirror's patterns (kmirror add --include).
	propDiscoveryInterval = "topics.discovery.interval"
	// propConfigSyncInterval is how often the leader copies changed
	// source topic configs to the mirror topics; propConfigExclude names
	// configs it leaves alone.
	propConfigSyncInterval = "topics.config.sync.interval"
	propConfigExclude      = "topics.config.exclude"
	// ACL sync (off by default): the source's ACLs of mirrored topics and
	// synced groups, for principals the regexes select.
	propACLSync    = "acls.sync"
	propACLInclude = "acls.include"
	propACLExclude = "acls.exclude"
)

// maxFetchConns bounds fetch.connections: each connection holds a fetch
// session in the source broker's cache (max.incremental.fetch.session.cache.slots,
// 1000 by default, shared by all its consumers).
const maxFetchConns = 32

// sourceProperties are the mirror properties this version understands
// besides the security ones (ksec.IsKey); a property kmirror does not act
// on is refused rather than ignored.
var sourceProperties = map[string]bool{
	propBootstrap: true, propClientID: true,
	propGroupsInclude: true, PropGroupsExclude: true, propGroupsInterval: true, propFailoverAuto: true,
	propFetchConns: true, propDiscoveryInterval: true, propConfigSyncInterval: true, propConfigExclude: true,
	propACLSync: true, propACLInclude: true, propACLExclude: true,
	propHookExec: true, propHookURL: true, propHookTimeout: true, propHookRetries: true,
	propVerifyMode: true, propVerifyRecords: true, propVerifyBytes: true,
}

// minFailoverAuto bounds failover.auto.after.ms from below: members probe
// the source every second, so a shorter wait would act on one probe.
const minFailoverAuto = 3 * time.Second

// defaultGroupSyncInterval is groups.sync.interval when not given.
const defaultGroupSyncInterval = 5 * time.Second

// minGroupSyncInterval bounds groups.sync.interval from below: every sync
// lists the groups of both clusters.
const minGroupSyncInterval = 100 * time.Millisecond

// DefaultDiscoveryInterval is topics.discovery.interval when not given
// (MirrorMaker 2's refresh.topics.interval.seconds is 600 s; KIP-1279
// leaves it to the implementation).
const DefaultDiscoveryInterval = 30 * time.Second

// DefaultConfigSyncInterval is topics.config.sync.interval when not given.
const DefaultConfigSyncInterval = time.Minute

// minConfigSyncInterval bounds topics.config.sync.interval from below:
// each round describes every mirrored topic's configs on both clusters.
const minConfigSyncInterval = time.Second

// minDiscoveryInterval bounds topics.discovery.interval from below: each
// discovery reads the source's metadata for every topic.
const minDiscoveryInterval = 500 * time.Millisecond

// Settings are a mirror's properties, parsed and checked.
type Settings struct {
	Bootstrap []string
	// GroupsInclude and GroupsExclude select the consumer groups whose
	// offsets are synced (whole-name matches, Java regex syntax as
	// MirrorMaker 2's groups and groups.exclude); Exclude is nil when not
	// given.
	GroupsInclude *regexp.Regexp
	GroupsExclude *regexp.Regexp
	// GroupSyncInterval is how often group offsets are synced.
	GroupSyncInterval time.Duration
	// FailoverAutoAfter is how long the source must not answer a majority
	// of the members before the group fails the mirror over; 0 = never.
	FailoverAutoAfter time.Duration
	// FetchConnections is fetch.connections (0: sized from the round
	// trip to each source broker).
	FetchConnections int
	// DiscoveryInterval is how often the leader looks for new source
	// topics matching the mirror's patterns (topics.discovery.interval).
	DiscoveryInterval time.Duration
	// ConfigSyncInterval is how often the leader copies changed source
	// topic configs to the mirror topics (topics.config.sync.interval);
	// ConfigExclude names the configs it leaves alone
	// (topics.config.exclude).
	ConfigSyncInterval time.Duration
	ConfigExclude      []string
	// ACLSync copies the source's ACLs of the mirror's topics and synced
	// groups to the destination at each config sync (acls.sync), for the
	// principals ACLInclude matches and ACLExclude (nil: none) does not.
	ACLSync    bool
	ACLInclude *regexp.Regexp
	ACLExclude *regexp.Regexp
	// Hook is the mirror's failover hook (none: Exec and URL empty).
	Hook Hook
	// Verify is the mirror's background verification.
	Verify Verify
	// Security is how to reach the source: TLS, SASL (security.protocol,
	// ssl.*, sasl.*).
	Security ksec.Settings
}

// SyncsACLsOf reports whether ACL sync copies the ACLs of principal.
func (s Settings) SyncsACLsOf(principal string) bool {
	return s.ACLSync && s.ACLInclude.MatchString(principal) && (s.ACLExclude == nil || !s.ACLExclude.MatchString(principal))
}

// SyncsGroup reports whether the mirror syncs the group's offsets.
func (s Settings) SyncsGroup(group string) bool {
	return s.GroupsInclude.MatchString(group) && (s.GroupsExclude == nil || !s.GroupsExclude.MatchString(group))
}

// Parse checks a mirror's properties (kmirror create/alter --mirror-config); errors name the property
// and what to write instead.
func Parse(name string, props map[string]string) (Settings, error) {
	var unknown []string
	for k := range props {
		if !sourceProperties[k] && !ksec.IsKey(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		known := append(slices.Sorted(maps.Keys(sourceProperties)), ksec.Keys()...)
		var hints []string
		for _, k := range unknown {
			if near := closest(k, known); near != "" {
				hints = append(hints, fmt.Sprintf("%s: did you mean %s?", k, near))
			}
		}
		hint := ""
		if len(hints) > 0 {
			hint = " " + strings.Join(hints, " ")
		}
		return Settings{}, fmt.Errorf("%w: mirror %s: unsupported mirror properties %s:%s this version supports %s, %s, %s, %s, %s, %s, %s and the security properties %s",
			api.ErrInvalid, name, strings.Join(unknown, ", "), hint, propBootstrap, propClientID, propGroupsInclude, PropGroupsExclude, propGroupsInterval,
			propFailoverAuto, propFetchConns+", "+propDiscoveryInterval+", "+propConfigSyncInterval+", "+propConfigExclude+", "+propACLSync+", "+propACLInclude+", "+propACLExclude+", "+
				propHookExec+", "+propHookURL+", "+propHookTimeout+", "+propHookRetries+", "+propVerifyMode+", "+propVerifyRecords+", "+propVerifyBytes,
			strings.Join(ksec.Keys(), ", "))
	}
	sec, err := ksec.Parse(props, "mirror "+name)
	if err != nil {
		return Settings{}, fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	s := Settings{Bootstrap: splitList(props[propBootstrap]), GroupSyncInterval: defaultGroupSyncInterval, DiscoveryInterval: DefaultDiscoveryInterval,
		ConfigSyncInterval: DefaultConfigSyncInterval, Security: sec}
	if len(s.Bootstrap) == 0 {
		return Settings{}, fmt.Errorf("%w: mirror properties need bootstrap.servers (host:port list of the source cluster)", api.ErrInvalid)
	}
	for _, b := range s.Bootstrap {
		if err := checkHostPort(b); err != nil {
			return Settings{}, fmt.Errorf("%w: bootstrap.servers entry %q: %v: give host:port of a source broker's listener, e.g. kafka1:9092", api.ErrInvalid, b, err)
		}
	}
	if s.GroupsInclude, err = groupRegexp(propGroupsInclude, props[propGroupsInclude], ".*"); err != nil {
		return Settings{}, err
	}
	if v := strings.TrimSpace(props[PropGroupsExclude]); v != "" {
		if s.GroupsExclude, err = groupRegexp(PropGroupsExclude, v, ""); err != nil {
			return Settings{}, err
		}
	}
	if v := strings.TrimSpace(props[propGroupsInterval]); v != "" {
		d, err := parseInterval(v)
		if err != nil || d < minGroupSyncInterval {
			return Settings{}, fmt.Errorf("%w: %s=%s: give a duration of at least %s, as milliseconds (5000) or with a unit (5s, 1m)",
				api.ErrInvalid, propGroupsInterval, v, minGroupSyncInterval)
		}
		s.GroupSyncInterval = d
	}
	if v := strings.TrimSpace(props[propDiscoveryInterval]); v != "" {
		d, err := parseInterval(v)
		if err != nil || d < minDiscoveryInterval {
			return Settings{}, fmt.Errorf("%w: %s=%s: give a duration of at least %s, as milliseconds (30000) or with a unit (30s, 5m)",
				api.ErrInvalid, propDiscoveryInterval, v, minDiscoveryInterval)
		}
		s.DiscoveryInterval = d
	}
	if v := strings.TrimSpace(props[propConfigSyncInterval]); v != "" {
		d, err := parseInterval(v)
		if err != nil || d < minConfigSyncInterval {
			return Settings{}, fmt.Errorf("%w: %s=%s: give a duration of at least %s, as milliseconds (60000) or with a unit (60s, 5m)",
				api.ErrInvalid, propConfigSyncInterval, v, minConfigSyncInterval)
		}
		s.ConfigSyncInterval = d
	}
	switch v := strings.TrimSpace(props[propACLSync]); v {
	case "", "false":
	case "true":
		s.ACLSync = true
	default:
		return Settings{}, fmt.Errorf("%w: %s=%s: give true or false", api.ErrInvalid, propACLSync, v)
	}
	if s.ACLInclude, err = principalRegexp(propACLInclude, props[propACLInclude], ".*"); err != nil {
		return Settings{}, err
	}
	if v := strings.TrimSpace(props[propACLExclude]); v != "" {
		if s.ACLExclude, err = principalRegexp(propACLExclude, v, ""); err != nil {
			return Settings{}, err
		}
	}
	known := kafka.MirroredConfigNames()
	for _, name := range splitList(props[propConfigExclude]) {
		if !slices.Contains(known, name) {
			return Settings{}, fmt.Errorf("%w: %s lists %s, which kmirror does not copy: it copies %s", api.ErrInvalid, propConfigExclude, name,
				strings.Join(known, ", "))
		}
		s.ConfigExclude = append(s.ConfigExclude, name)
	}
	if v := strings.TrimSpace(props[propFetchConns]); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxFetchConns {
			return Settings{}, fmt.Errorf("%w: %s=%s: give a count of connections per source broker from 1 to %d, or leave it out to size it from the round trip",
				api.ErrInvalid, propFetchConns, v, maxFetchConns)
		}
		s.FetchConnections = n
	}
	if v := strings.TrimSpace(props[propFailoverAuto]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || (n != 0 && time.Duration(n)*time.Millisecond < minFailoverAuto) || n < 0 {
			return Settings{}, fmt.Errorf("%w: %s=%s: give milliseconds, at least %d, or 0 to turn automatic failover off",
				api.ErrInvalid, propFailoverAuto, v, minFailoverAuto.Milliseconds())
		}
		s.FailoverAutoAfter = time.Duration(n) * time.Millisecond
	}
	if s.Hook, err = parseHook(props); err != nil {
		return Settings{}, err
	}
	if s.Verify, err = parseVerify(props); err != nil {
		return Settings{}, err
	}
	return s, nil
}

// groupRegexp compiles a group filter as a whole-name match.
func groupRegexp(prop, v, def string) (*regexp.Regexp, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		v = def
	}
	re, err := wholeName(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%s is not a regular expression (%v): give one regex matched against the whole group name; "+
			"combine several with |, e.g. orders-.*|billing", api.ErrInvalid, prop, v, err)
	}
	return re, nil
}

// principalRegexp compiles an ACL principal filter as a whole-name match.
func principalRegexp(prop, v, def string) (*regexp.Regexp, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		v = def
	}
	re, err := wholeName(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%s is not a regular expression (%v): give one regex matched against the whole principal, "+
			"e.g. User:app-.*|User:billing", api.ErrInvalid, prop, v, err)
	}
	return re, nil
}

// TopicPattern compiles a topic pattern (kmirror add --include/--exclude):
// a Go regular expression (RE2) matched against the whole topic name, as
// MirrorMaker 2's topics and topics.exclude. The error says what was
// wrong and how to write one.
func TopicPattern(flag, v string) (*regexp.Regexp, error) {
	if strings.TrimSpace(v) == "" {
		return nil, fmt.Errorf("%w: %s: an empty pattern: give a regex matched against the whole topic name, e.g. orders\\..*", api.ErrInvalid, flag)
	}
	re, err := wholeName(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %s is not a regular expression (%v): give one regex matched against the whole topic name, "+
			"e.g. orders\\..* or (orders|billing)-.*", api.ErrInvalid, flag, v, err)
	}
	return re, nil
}

// wholeName compiles v anchored at both ends; the error is about the
// operator's own text.
func wholeName(v string) (*regexp.Regexp, error) {
	if _, err := regexp.Compile(v); err != nil {
		return nil, err
	}
	return regexp.Compile("^(?:" + v + ")$")
}

// parseInterval reads milliseconds ("5000") or a Go duration ("5s").
func parseInterval(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(n) * time.Millisecond, nil
	}
	return time.ParseDuration(v)
}

// closest returns the key of known within edit distance 2 of k (a typo),
// or "".
func closest(k string, known []string) string {
	best, bestD := "", 3
	for _, c := range known {
		if d := editDistance(k, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// checkHostPort checks that s is host:port with a port number.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return errors.New("not host:port")
	}
	if host == "" {
		return errors.New("the host is empty")
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
