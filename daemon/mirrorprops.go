package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// Mirror properties (the --mirror-config file, Kafka .properties syntax).
const (
	propBootstrap      = "bootstrap.servers"
	propClientID       = "client.id"
	propGroupsInclude  = "groups.include"
	propGroupsExclude  = "groups.exclude"
	propGroupsInterval = "groups.sync.interval"
	propFailoverAuto   = "failover.auto.after.ms"
)

// sourceProperties are the mirror properties this version understands
// besides the security ones (ksec.IsKey); a property kmirror does not act
// on is refused rather than ignored.
var sourceProperties = map[string]bool{
	propBootstrap: true, propClientID: true,
	propGroupsInclude: true, propGroupsExclude: true, propGroupsInterval: true, propFailoverAuto: true,
}

// minFailoverAuto bounds failover.auto.after.ms from below: members probe
// the source every second, so a shorter wait would act on one probe.
const minFailoverAuto = 3 * time.Second

// defaultGroupSyncInterval is groups.sync.interval when not given.
const defaultGroupSyncInterval = 5 * time.Second

// minGroupSyncInterval bounds groups.sync.interval from below: every sync
// lists the groups of both clusters.
const minGroupSyncInterval = 100 * time.Millisecond

// mirrorSettings are a mirror's properties, parsed and checked.
type mirrorSettings struct {
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
	// Security is how to reach the source: TLS, SASL (security.protocol,
	// ssl.*, sasl.*).
	Security ksec.Settings
}

// syncsGroup reports whether the mirror syncs the group's offsets.
func (s mirrorSettings) syncsGroup(group string) bool {
	return s.GroupsInclude.MatchString(group) && (s.GroupsExclude == nil || !s.GroupsExclude.MatchString(group))
}

// parseMirrorSettings checks mirror properties; errors name the property
// and what to write instead.
func parseMirrorSettings(name string, props map[string]string) (mirrorSettings, error) {
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
		return mirrorSettings{}, fmt.Errorf("%w: mirror %s: unsupported mirror properties %s:%s this version supports %s, %s, %s, %s, %s, %s and the security properties %s",
			api.ErrInvalid, name, strings.Join(unknown, ", "), hint, propBootstrap, propClientID, propGroupsInclude, propGroupsExclude, propGroupsInterval,
			propFailoverAuto, strings.Join(ksec.Keys(), ", "))
	}
	sec, err := ksec.Parse(props, "mirror "+name)
	if err != nil {
		return mirrorSettings{}, fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	s := mirrorSettings{Bootstrap: splitList(props[propBootstrap]), GroupSyncInterval: defaultGroupSyncInterval, Security: sec}
	if len(s.Bootstrap) == 0 {
		return mirrorSettings{}, fmt.Errorf("%w: mirror properties need bootstrap.servers (host:port list of the source cluster)", api.ErrInvalid)
	}
	for _, b := range s.Bootstrap {
		if err := checkHostPort(b); err != nil {
			return mirrorSettings{}, fmt.Errorf("%w: bootstrap.servers entry %q: %v: give host:port of a source broker's listener, e.g. kafka1:9092", api.ErrInvalid, b, err)
		}
	}
	if s.GroupsInclude, err = groupRegexp(propGroupsInclude, props[propGroupsInclude], ".*"); err != nil {
		return mirrorSettings{}, err
	}
	if v := strings.TrimSpace(props[propGroupsExclude]); v != "" {
		if s.GroupsExclude, err = groupRegexp(propGroupsExclude, v, ""); err != nil {
			return mirrorSettings{}, err
		}
	}
	if v := strings.TrimSpace(props[propGroupsInterval]); v != "" {
		d, err := parseInterval(v)
		if err != nil || d < minGroupSyncInterval {
			return mirrorSettings{}, fmt.Errorf("%w: %s=%s: give a duration of at least %s, as milliseconds (5000) or with a unit (5s, 1m)",
				api.ErrInvalid, propGroupsInterval, v, minGroupSyncInterval)
		}
		s.GroupSyncInterval = d
	}
	if v := strings.TrimSpace(props[propFailoverAuto]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || (n != 0 && time.Duration(n)*time.Millisecond < minFailoverAuto) || n < 0 {
			return mirrorSettings{}, fmt.Errorf("%w: %s=%s: give milliseconds, at least %d, or 0 to turn automatic failover off",
				api.ErrInvalid, propFailoverAuto, v, minFailoverAuto.Milliseconds())
		}
		s.FailoverAutoAfter = time.Duration(n) * time.Millisecond
	}
	return s, nil
}

// groupRegexp compiles a group filter as a whole-name match.
func groupRegexp(prop, v, def string) (*regexp.Regexp, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		v = def
	}
	_, err := regexp.Compile(v) // the operator's own text, for the error
	if err == nil {
		_, err = regexp.Compile("^(?:" + v + ")$")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%s is not a regular expression (%v): give one regex matched against the whole group name; "+
			"combine several with |, e.g. orders-.*|billing", api.ErrInvalid, prop, v, err)
	}
	return regexp.MustCompile("^(?:" + v + ")$"), nil
}

// parseInterval reads milliseconds ("5000") or a Go duration ("5s").
func parseInterval(v string) (time.Duration, error) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Duration(n) * time.Millisecond, nil
	}
	return time.ParseDuration(v)
}

// AlterMirror replaces a mirror's properties: the group filters and sync
// interval take effect at the next sync, a new bootstrap.servers, client.id
// or security setting when the data path reconnects (at once for new
// security settings). New connection settings must reach the same source
// cluster (its cluster ID is checked, with the new credentials): a mirror
// never changes the cluster it mirrors.
func (m *Member) AlterMirror(ctx context.Context, req api.CreateMirrorRequest) error {
	if c, err := m.toLeader(ctx); err != nil || c != nil {
		if err != nil {
			return err
		}
		return c.AlterMirror(ctx, req)
	}
	settings, err := parseMirrorSettings(req.Name, req.Properties)
	if err != nil {
		return err
	}
	var mir *raftstore.Mirror
	m.store.Read(func(s *raftstore.State) {
		if x, ok := s.Mirrors[req.Name]; ok {
			mir = x.Clone()
		}
	})
	if mir == nil {
		return fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, req.Name)
	}
	if _, oldKey := mirrorSecurity(*mir); !slices.Equal(settings.Bootstrap, mir.Bootstrap) || settings.Security.Key() != oldKey {
		id, err := m.checkSource(ctx, settings)
		if err != nil {
			return err
		}
		if mir.SourceClusterID != "" && id != mir.SourceClusterID {
			return fmt.Errorf("%w: bootstrap.servers %s reaches cluster %s, but mirror %s mirrors cluster %s: a mirror cannot move to "+
				"another cluster; create a new mirror for it", api.ErrInvalid, strings.Join(settings.Bootstrap, ","), id, req.Name, mir.SourceClusterID)
		}
	}
	return mapStoreErr(m.store.Apply(ctx, raftstore.AlterMirror{Name: req.Name, Bootstrap: settings.Bootstrap, Properties: req.Properties}))
}

// checkSource connects to a source cluster with new settings (reading
// their files here, on the member that handles the request) and returns
// its cluster ID. Credential and certificate failures are ErrInvalid: the
// settings are wrong; an unreachable cluster is ErrUnavailable.
func (m *Member) checkSource(ctx context.Context, settings mirrorSettings) (string, error) {
	if _, err := settings.Security.Resolve(); err != nil {
		return "", fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	src := kafka.NewAdmin("source cluster", settings.Bootstrap, m.cfg.Destination.ClientID, securityOf(settings.Security))
	defer src.Close()
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	id, err := src.ClusterID(cctx)
	switch {
	case errors.Is(err, kwire.ErrAuthentication):
		return "", fmt.Errorf("%w: %v", api.ErrInvalid, err)
	case err != nil:
		return "", fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	return id, nil
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
