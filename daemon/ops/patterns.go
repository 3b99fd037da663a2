package ops

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// Topic patterns (issue 21): a mirror keeps include and exclude patterns
// (raftstore.Mirror.Include/Exclude); the leader lists the source's topics
// every topics.discovery.interval (leader.discoveryLoop) and adds each new
// match as `kmirror add --topic` does. Internal topics (names starting with
// "__", the source's own __kmirror* among them) are never matched. A
// topic no longer matched, or deleted on the source, is not removed from
// the destination. A match that cannot be added is skipped and named on
// the mirror (raftstore.Mirror.Skipped, shown by describe and list), and
// tried again at the next discovery: mirrored by another mirror, removed
// from this one (kmirror remove: add it by name to mirror it again), or
// refused by add (the destination topic exists and kmirror did not write
// it, the destination refuses the creation...).

// discoverMu serialises discoveries (the leader's loop and an operator's
// add --include), so that two do not add the same topic at once.
var discoverMu sync.Mutex

// addConcurrency bounds how many topics one discovery adds at once.
const addConcurrency = 4

// compilePatterns checks every pattern, naming the flag of a bad one.
func compilePatterns(flag string, pats []string) ([]*regexp.Regexp, error) {
	out := make([]*regexp.Regexp, 0, len(pats))
	for _, p := range pats {
		re, err := mirrorprops.TopicPattern(flag, p)
		if err != nil {
			return nil, err
		}
		out = append(out, re)
	}
	return out, nil
}

// union appends to have the entries of add it lacks, in order.
func union(have, add []string) []string {
	out := slices.Clone(have)
	for _, p := range add {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// addPatterns serves add --include/--exclude on the leader: the patterns
// join the mirror's, then a discovery adds what they match now (from
// req.StartFrom, with req.ReplicationFactor; topics found later start
// from their first record). Topics named with --topic are added first,
// as a plain add does.
func (o *Ops) addPatterns(ctx context.Context, req api.AddTopicsRequest) (api.AddResult, error) {
	mir, err := o.patternMirror(req.Mirror, req.Include, req.Exclude)
	if err != nil {
		return api.AddResult{}, err
	}
	include, exclude := union(mir.Include, req.Include), union(mir.Exclude, req.Exclude)
	if len(include) == 0 {
		return api.AddResult{}, fmt.Errorf("%w: --exclude %s: mirror %s has no --include pattern for it to narrow: give --include too",
			api.ErrInvalid, strings.Join(req.Exclude, " --exclude "), req.Mirror)
	}
	res := api.AddResult{Status: "added"}
	if len(req.Topics) > 0 {
		byName := req
		byName.Include, byName.Exclude = nil, nil
		if _, err := o.addTopics(ctx, byName, &res); err != nil {
			return res, err
		}
	}
	if err := StoreErr(o.store.Apply(ctx, raftstore.SetTopicPatterns{Name: req.Mirror, Include: include, Exclude: exclude})); err != nil {
		return res, err
	}
	found, err := o.discover(ctx, req.Mirror, req.StartFrom, req.ReplicationFactor)
	res.Topics = append(res.Topics, found.Topics...)
	res.Truncated = append(res.Truncated, found.Truncated...)
	res.Notes = append(res.Notes, found.Notes...)
	return res, err
}

// SetTopicPatterns replaces a mirror's topic patterns (kmirror alter
// --include/--exclude), or with req.Remove takes the given ones out of
// them (kmirror remove --include/--exclude; the topics they added stay
// mirrored). New include patterns are matched at once (a discovery).
func (o *Ops) SetTopicPatterns(ctx context.Context, req api.PatternsRequest) (api.AddResult, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return api.AddResult{}, err
		}
		return c.SetTopicPatterns(ctx, req)
	}
	mir, err := o.patternMirror(req.Mirror, req.Include, req.Exclude)
	if err != nil {
		return api.AddResult{}, err
	}
	include, exclude := slices.Clone(req.Include), slices.Clone(req.Exclude)
	if req.Remove {
		var missing []string
		include, missing = without(mir.Include, req.Include, "--include", missing)
		exclude, missing = without(mir.Exclude, req.Exclude, "--exclude", missing)
		if len(missing) > 0 {
			return api.AddResult{}, fmt.Errorf("%w: mirror %s has no pattern %s (its patterns: %s; see kmirror list)",
				api.ErrNotFound, req.Mirror, strings.Join(missing, ", "), patternText(mir.Include, mir.Exclude))
		}
	}
	if len(include) == 0 && len(exclude) > 0 {
		return api.AddResult{}, fmt.Errorf("%w: mirror %s would keep --exclude %s without an --include pattern to narrow: remove the exclude "+
			"patterns too, or keep an include", api.ErrInvalid, req.Mirror, strings.Join(exclude, ", "))
	}
	if err := StoreErr(o.store.Apply(ctx, raftstore.SetTopicPatterns{Name: req.Mirror, Include: include, Exclude: exclude})); err != nil {
		return api.AddResult{}, err
	}
	res := api.AddResult{Status: "altered"}
	if req.Remove || len(include) == 0 {
		return res, nil
	}
	found, err := o.discover(ctx, req.Mirror, "", 0)
	found.Status = res.Status
	return found, err
}

// patternMirror checks include and exclude patterns and returns a copy of
// mirror's record.
func (o *Ops) patternMirror(mirror string, include, exclude []string) (*raftstore.Mirror, error) {
	if _, err := compilePatterns("--include", include); err != nil {
		return nil, err
	}
	if _, err := compilePatterns("--exclude", exclude); err != nil {
		return nil, err
	}
	var mir *raftstore.Mirror
	o.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[mirror]; ok {
			mir = m.Clone()
		}
	})
	if mir == nil {
		return nil, fmt.Errorf("%w: mirror %s does not exist (create it with kmirror create; see kmirror list)", api.ErrNotFound, mirror)
	}
	return mir, nil
}

// without returns have less drop; entries of drop not in have are
// appended to missing as "flag pattern".
func without(have, drop []string, flag string, missing []string) ([]string, []string) {
	out := slices.Clone(have)
	for _, p := range drop {
		i := slices.Index(out, p)
		if i < 0 {
			missing = append(missing, flag+" "+p)
			continue
		}
		out = slices.Delete(out, i, i+1)
	}
	return out, missing
}

// patternText shows a mirror's patterns for messages and kmirror list.
func patternText(include, exclude []string) string {
	if len(include) == 0 {
		return "none"
	}
	s := "include " + strings.Join(include, ", ")
	if len(exclude) > 0 {
		s += "; exclude " + strings.Join(exclude, ", ")
	}
	return s
}

// DiscoverTopics is the leader's discovery round for one mirror
// (leader.discoveryLoop): what add --include does after saving patterns.
// An error means the round could not run (the source does not answer);
// topics it could not add are in the result and on the mirror.
func (o *Ops) DiscoverTopics(ctx context.Context, mirror string) (api.AddResult, error) {
	return o.discover(ctx, mirror, "", 0)
}

// discover lists the mirror's source topics, adds each one the patterns
// match that no mirror mirrors yet, and records the matches it skipped.
func (o *Ops) discover(ctx context.Context, mirror, startFrom string, rf int16) (api.AddResult, error) {
	discoverMu.Lock()
	defer discoverMu.Unlock()
	res := api.AddResult{Status: "added"}
	var mir *raftstore.Mirror
	o.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[mirror]; ok {
			mir = m.Clone()
		}
	})
	if mir == nil || len(mir.Include) == 0 {
		return res, nil
	}
	m, err := o.matching(ctx, *mir, mir.Include, mir.Exclude)
	if err != nil {
		return res, err
	}
	res.Notes = m.notes
	added := o.addEach(ctx, mirror, m.add, startFrom, rf)
	for _, r := range added {
		if r.Result == api.TopicNotAdded {
			m.skipped[r.Topic] = "matched, but not added: " + r.Error
		}
	}
	res.Topics = added
	for _, t := range slices.Sorted(maps.Keys(m.skipped)) {
		if !slices.ContainsFunc(added, func(a api.AddedTopic) bool { return a.Topic == t }) {
			res.Notes = append(res.Notes, fmt.Sprintf("%s skipped: %s", t, m.skipped[t]))
		}
	}
	if !maps.Equal(m.skipped, mir.Skipped) {
		if err := StoreErr(o.store.Apply(ctx, raftstore.SetDiscoverySkips{Name: mirror, Skipped: m.skipped})); err != nil {
			o.log.Warn("record the topics a discovery skipped", zap.String("mirror", mirror), zap.Error(err))
		}
	}
	var names []string
	for _, r := range added {
		if r.Result != api.TopicNotAdded {
			names = append(names, r.Topic)
		}
	}
	if len(names) > 0 {
		o.log.Info("topics matched by the mirror's patterns added", zap.String("mirror", mirror), zap.Strings("topics", names))
	}
	return res, nil
}

// matches is what a mirror's patterns match on its source now.
type matches struct {
	add     []string          // matched, mirrored by no mirror: to add
	skipped map[string]string // matched, not to add, with why
	notes   []string          // patterns that match nothing
}

// matching lists the mirror's source topics and sorts those include and
// exclude match.
func (o *Ops) matching(ctx context.Context, mir raftstore.Mirror, includes, excludes []string) (matches, error) {
	m := matches{skipped: map[string]string{}}
	include, err := compilePatterns("include pattern", includes)
	if err != nil {
		return m, err
	}
	exclude, err := compilePatterns("exclude pattern", excludes)
	if err != nil {
		return m, err
	}
	taken, stopped := map[string]string{}, map[string]string{}
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.State == raftstore.StateStopped {
				stopped[t.Topic] = t.Mirror
			} else {
				taken[t.Topic] = t.Mirror
			}
		}
	})
	src := o.member.SourceAdmin(mir)
	defer src.Close()
	lctx, cancel := context.WithTimeout(ctx, adminTimeout)
	topics, err := src.ListTopics(lctx)
	cancel()
	if err != nil {
		return m, fmt.Errorf("%w: mirror %s: %v", api.ErrUnavailable, mir.Name, err)
	}
	matched := make([]int, len(include))
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		if strings.HasPrefix(t, "__") || !matchesAny(include, t, matched) || matchesAny(exclude, t, nil) {
			continue
		}
		owner, isTaken := taken[t]
		was, isStopped := stopped[t]
		switch {
		case isTaken && owner == mir.Name:
		case isTaken:
			m.skipped[t] = fmt.Sprintf("matched, but mirrored by mirror %s (a topic has one mirror)", owner)
		case isStopped:
			m.skipped[t] = fmt.Sprintf("matched, but removed from mirror %s (kmirror remove): patterns do not add it again; "+
				"kmirror add --mirror %s --topic %s does", was, mir.Name, t)
		default:
			m.add = append(m.add, t)
		}
	}
	for i, n := range matched {
		if n == 0 {
			m.notes = append(m.notes, fmt.Sprintf("pattern %s matches no source topic yet: kept; a topic created later that matches "+
				"it is added within topics.discovery.interval", includes[i]))
		}
	}
	return m, nil
}

// planPatterns is add --dry-run with patterns: the plan of each topic they
// would add now (and of those named by --topic), changing nothing.
func (o *Ops) planPatterns(ctx context.Context, req api.AddTopicsRequest) ([]truncate.Plan, error) {
	var mir *raftstore.Mirror
	o.store.Read(func(s *raftstore.State) {
		if m, ok := s.Mirrors[req.Mirror]; ok {
			mir = m.Clone()
		}
	})
	if mir == nil {
		return nil, fmt.Errorf("%w: mirror %s does not exist (create it with kmirror create)", api.ErrNotFound, req.Mirror)
	}
	include, exclude := union(mir.Include, req.Include), union(mir.Exclude, req.Exclude)
	if len(include) == 0 {
		return nil, fmt.Errorf("%w: --exclude without an --include pattern on the mirror or this add: give --include", api.ErrInvalid)
	}
	m, err := o.matching(ctx, *mir, include, exclude)
	if err != nil {
		return nil, err
	}
	byName := req
	byName.Include, byName.Exclude = nil, nil
	byName.Topics = union(req.Topics, m.add)
	var plans []truncate.Plan
	if len(byName.Topics) > 0 {
		if plans, err = o.addTopics(ctx, byName, nil); err != nil {
			return nil, err
		}
	}
	for _, t := range slices.Sorted(maps.Keys(m.skipped)) {
		plans = append(plans, truncate.Plan{Mirror: req.Mirror, Topic: t, Kind: truncate.KindRefused, Reason: m.skipped[t]})
	}
	return plans, nil
}

// matchesAny reports whether a pattern of res matches topic, counting
// each match in counts (when given).
func matchesAny(res []*regexp.Regexp, topic string, counts []int) bool {
	hit := false
	for i, re := range res {
		if re.MatchString(topic) {
			hit = true
			if counts == nil {
				return true
			}
			counts[i]++
		}
	}
	return hit
}

// addEach adds each topic as its own add (one refusal must not hold back
// the others), a few at once, and returns what became of each, in order.
func (o *Ops) addEach(ctx context.Context, mirror string, topics []string, startFrom string, rf int16) []api.AddedTopic {
	out := make([]api.AddedTopic, len(topics))
	sem := make(chan struct{}, addConcurrency)
	var wg sync.WaitGroup
	for i, t := range topics {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			var r api.AddResult
			_, err := o.addTopics(ctx, api.AddTopicsRequest{Mirror: mirror, Topics: []string{t}, StartFrom: startFrom, ReplicationFactor: rf,
				Discovery: true}, &r)
			switch {
			case len(r.Topics) > 0:
				out[i] = r.Topics[0]
			case err != nil:
				out[i] = api.AddedTopic{Topic: t, Result: api.TopicNotAdded, Error: err.Error()}
			default:
				out[i] = api.AddedTopic{Topic: t, Result: api.TopicAdded}
			}
			if err != nil && errors.Is(err, api.ErrExists) && o.mirroredBy(t) == mirror {
				out[i] = api.AddedTopic{Topic: t, Result: api.TopicAdded} // added meanwhile by name
			}
		}()
	}
	wg.Wait()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Topic < out[j].Topic })
	return out
}

// mirroredBy is the mirror that mirrors topic now ("" for none).
func (o *Ops) mirroredBy(topic string) string {
	var owner string
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.Topic == topic && t.State != raftstore.StateStopped {
				owner = t.Mirror
			}
		}
	})
	return owner
}
