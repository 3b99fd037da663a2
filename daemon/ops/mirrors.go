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
	"time"

	"github.com/kmirror/kmirror/daemon/mirrorprops"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka/ksec"
	"github.com/kmirror/kmirror/raftstore"
)

// validName is what mirror names may be (Kafka's topic name alphabet).
var validName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// CreateMirror defines a mirror after checking its source cluster answers.
func (o *Ops) CreateMirror(ctx context.Context, req api.CreateMirrorRequest) error {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return err
		}
		return c.CreateMirror(ctx, req)
	}
	if !validName.MatchString(req.Name) {
		return fmt.Errorf("%w: mirror name %q: use 1-249 characters of A-Z a-z 0-9 . _ -", api.ErrInvalid, req.Name)
	}
	settings, err := mirrorprops.Parse(req.Name, req.Properties)
	if err != nil {
		return err
	}
	bootstrap := settings.Bootstrap
	exists := false
	o.store.Read(func(s *raftstore.State) { _, exists = s.Mirrors[req.Name] })
	if exists {
		return fmt.Errorf("%w: mirror %s already exists: delete it first or pick another name", api.ErrExists, req.Name)
	}
	clusterID, err := o.checkSource(ctx, settings)
	if err != nil {
		return err
	}
	err = o.store.Apply(ctx, raftstore.CreateMirror{Mirror: raftstore.Mirror{
		Name: req.Name, Bootstrap: bootstrap, Properties: req.Properties, SourceClusterID: clusterID,
	}})
	return StoreErr(err)
}

// DeleteMirror removes a mirror; with force, its mirroring topics are
// stopped first (as remove does).
func (o *Ops) DeleteMirror(ctx context.Context, name string, force bool) error {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return err
		}
		return c.DeleteMirror(ctx, name, force)
	}
	var active []string
	found := false
	o.store.Read(func(s *raftstore.State) {
		_, found = s.Mirrors[name]
		for _, t := range s.Topics {
			if t.Mirror == name && t.State != raftstore.StateStopped {
				active = append(active, t.Topic)
			}
		}
	})
	if !found {
		return fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, name)
	}
	sort.Strings(active)
	if len(active) > 0 && !force {
		return fmt.Errorf("%w: mirror %s still mirrors %s: remove those topics first, or use --force to stop them and delete",
			api.ErrConflict, name, strings.Join(active, ", "))
	}
	for _, t := range active {
		if err := o.RemoveTopic(ctx, name, t); err != nil {
			return fmt.Errorf("stop %s before deleting mirror %s: %w", t, name, err)
		}
	}
	// No config sync round of the mirror runs once it is gone: its topics'
	// active records go now (a stop deleted most already).
	var all []string
	o.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.Mirror == name {
				all = append(all, t.Topic)
			}
		}
	})
	for _, t := range all {
		o.forgetActive(ctx, name, t)
	}
	return StoreErr(o.store.Apply(ctx, raftstore.DeleteMirror{Name: name}))
}

// RemoveTopic stops mirroring a topic: the topic becomes STOPPING in the
// replicated state, and the owner of each partition (whichever member
// holds it, or the next one if it crashes) stops fetching, produces what
// it fetched, and records the last mirrored position in raft and in the
// state topic. This returns once every partition is STOPPED; the
// destination topic is then the writable copy. STOPPING survives any
// crash: the owners carry it on.
func (o *Ops) RemoveTopic(ctx context.Context, mirror, topic string) error {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return err
		}
		return c.RemoveTopic(ctx, mirror, topic)
	}
	var state raftstore.TopicState
	found := false
	o.store.Read(func(s *raftstore.State) {
		if p, ok := s.Topic(mirror, topic); ok {
			state, found = p.State, true
		}
	})
	if !found {
		return fmt.Errorf("%w: mirror %s has no topic %s (see kmirror describe --mirror %s)", api.ErrNotFound, mirror, topic, mirror)
	}
	if state == raftstore.StateStopped {
		return nil
	}
	if state == raftstore.StatePending {
		// Nothing was mirrored: no partition ran, so there is no position
		// to record. The record goes; a destination topic an attempt
		// created stays (empty), as the reply says.
		if err := o.store.Apply(ctx, raftstore.RemoveTopic{Mirror: mirror, Topic: topic}); err != nil {
			return StoreErr(err)
		}
		o.log.Info("pending topic removed before any mirroring", zap.String("mirror", mirror), zap.String("topic", topic))
		o.forgetActive(ctx, mirror, topic)
		return nil
	}
	if state != raftstore.StateStopping {
		if err := o.store.Apply(ctx, raftstore.SetTopicState{Mirror: mirror, Topic: topic, State: raftstore.StateStopping}); err != nil {
			return StoreErr(err)
		}
	}
	return o.waitStopped(ctx, mirror, topic)
}

// waitStopped waits until every partition of the topic is STOPPED.
func (o *Ops) waitStopped(ctx context.Context, mirror, topic string) error {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, api.RemoveWait)
	defer cancel()
	changed, stop := o.store.Watch()
	defer stop()
	for {
		left, owners := 0, map[string]bool{}
		gone := true
		o.store.Read(func(s *raftstore.State) {
			t, ok := s.Topic(mirror, topic)
			if !ok {
				return
			}
			gone = false
			for _, p := range t.Partitions {
				if p.State != raftstore.StateStopped {
					left++
					owners[p.Owner] = true
				}
			}
		})
		if gone {
			return fmt.Errorf("%w: topic %s of mirror %s was deleted while it stopped", api.ErrNotFound, topic, mirror)
		}
		if left == 0 {
			o.lead.LiftReadOnly(ctx) // returns with the topic writable (README, Read-only mirror topics)
			return nil
		}
		select {
		case <-changed:
		case <-time.After(time.Second):
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err() // the caller went away; the topic stays STOPPING and its owners carry on
			}
			return fmt.Errorf("%w: %d partitions of %s are still STOPPING after %s (owners: %s): they stop once their owners have "+
				"drained them; check kmirror describe --mirror %s and the owners' logs, and run remove again to keep waiting",
				api.ErrUnavailable, left, topic, time.Since(start).Round(time.Second), strings.Join(sortedKeys(owners), ", "), mirror)
		}
	}
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		if k == "" {
			k = "none yet"
		}
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// ListMirrors summarises every mirror.
func (o *Ops) ListMirrors(ctx context.Context) ([]api.MirrorSummary, error) {
	if err := o.member.CaughtUp(ctx); err != nil {
		return nil, err
	}
	var out []api.MirrorSummary
	o.store.Read(func(s *raftstore.State) {
		for _, mir := range s.Mirrors {
			sum := api.MirrorSummary{Name: mir.Name, Bootstrap: mir.Bootstrap, Properties: redactHookURL(ksec.Redact(mir.Properties)), Topics: []string{},
				Include: slices.Clone(mir.Include), Exclude: slices.Clone(mir.Exclude), Skipped: maps.Clone(mir.Skipped), Notes: slices.Clone(mir.Notes),
				FailoverHooks: hookRuns(mir)}
			var states []raftstore.TopicState
			for _, t := range s.Topics {
				if t.Mirror == mir.Name {
					sum.Topics = append(sum.Topics, t.Topic)
					if d := s.WriteDenials[t.Topic]; len(d) > 0 {
						if sum.WriteDenied == nil {
							sum.WriteDenied = map[string][]string{}
						}
						sum.WriteDenied[t.Topic] = slices.Clone(d)
					}
					states = append(states, t.State)
					if t.State == raftstore.StateMirroring || t.State == raftstore.StateFailed {
						for _, p := range t.Partitions {
							states = append(states, p.State)
						}
					}
				}
			}
			sort.Strings(sum.Topics)
			sum.State = summarise(states)
			out = append(out, sum)
		}
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// summarise is the worst state among the mirror's topics and the
// partitions of its running topics, leaving STOPPED ones out (removed
// topics are done, not a problem): MIRRORING when all of those mirror, so
// one DIVERGED partition shows as DIVERGED; STOPPED when every topic is
// stopped; EMPTY without topics.
func summarise(states []raftstore.TopicState) string {
	if len(states) == 0 {
		return "EMPTY"
	}
	order := []raftstore.TopicState{raftstore.StateDiverged, raftstore.StateFailed, raftstore.StateStopping,
		raftstore.StatePending, raftstore.StatePaused, raftstore.StateMirroring, raftstore.StateStopped}
	for _, o := range order {
		for _, s := range states {
			if s == o {
				return string(o)
			}
		}
	}
	return string(raftstore.StateMirroring)
}

// Describe shows every partition of the selected topics.
//
// Any member answers for every partition of the group: offsets come from
// the members that run the partitions, asked at the time of the request.
func (o *Ops) Describe(ctx context.Context, mirror, topic string) ([]api.PartitionStatus, error) {
	if err := o.member.CaughtUp(ctx); err != nil {
		return nil, err
	}
	live, silent := o.member.LiveStatuses(ctx)
	var out []api.PartitionStatus
	var paused []int // rows of PAUSED partitions: their checkpoint is their position
	mirrorFound := mirror == ""
	o.store.Read(func(s *raftstore.State) {
		if _, ok := s.Mirrors[mirror]; ok {
			mirrorFound = true
		}
		for _, t := range s.Topics {
			if (mirror != "" && t.Mirror != mirror) || (topic != "" && t.Topic != topic) {
				continue
			}
			for i, p := range t.Partitions {
				ps := api.PartitionStatus{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i),
					State: string(p.State), Reason: p.Reason, Owner: p.Owner, SourceOffset: -1, DestinationOffset: -1, Lag: -1,
					SkippedRecords: p.SkippedRecords, LastGap: p.LastGap, StateSinceMs: p.StateSinceMs, Failures: p.Failures}
				if t.State == raftstore.StatePending || t.State == raftstore.StateStopping {
					ps.State = string(t.State)
				}
				if st, ok := live[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}]; ok && p.State != raftstore.StateStopped {
					ps.DestinationOffset = st.DestinationOffset
					if st.SourceEnd >= 0 {
						ps.SourceOffset, ps.Lag = st.SourceEnd, st.Lag
					}
					if st.State == string(fetch.Starting) && ps.State == string(raftstore.StateMirroring) {
						ps.Reason = "starting: checking the destination against the source before mirroring (from the last checkpoint, or from the start)"
					}
					ps.DuplicateRecords, ps.ConvertedRecords = st.DuplicateRecords, st.ConvertedRecords
					stale := ""
					if ps.State == string(raftstore.StateMirroring) && st.State == string(fetch.Mirroring) {
						stale = staleness(st, p.Owner)
					}
					if stale != "" {
						ps.Lag = -1 // not known: never shown as caught up
					}
					switch {
					case ps.State != string(raftstore.StateMirroring):
					case stale != "":
						ps.Reason = stale
					case st.Retrying != "":
						ps.Reason = "retrying: " + st.Retrying
					case st.Duplicate != "" && ps.Reason == "":
						ps.Reason = fmt.Sprintf("duplicate: %d records so far; the latest: %s", st.DuplicateRecords, st.Duplicate)
					case st.Throttled != "" && ps.Reason == "":
						ps.Reason = st.Throttled
					case st.Waiting != "" && ps.Reason == "":
						ps.Reason = st.Waiting
					}
				} else if silent[p.Owner] && ps.State == string(raftstore.StateMirroring) {
					ps.Reason = fmt.Sprintf("owner %s did not answer: offsets unknown (if it is down, the leader moves its partitions after lease_ttl; see kmirror members)", p.Owner)
				} else if p.LastMirrored != nil {
					ps.SourceOffset, ps.DestinationOffset, ps.Lag = p.LastMirrored.SourceOffset, p.LastMirrored.DestinationOffset, 0
				} else if ps.State == string(raftstore.StatePaused) {
					paused = append(paused, len(out))
				}
				if ps.Reason == "" && len(t.DeferredConfigs) > 0 && i < len(t.DeferUntil) && p.State == raftstore.StateMirroring {
					ps.Reason = fmt.Sprintf("destination topic kept cleanup.policy=delete until every partition is mirrored past the source's "+
						"high watermark at add (here %d): records without a key written before the source became compacted "+
						"must be accepted; then it gets cleanup.policy=%s", t.DeferUntil[i], t.DeferredConfigs["cleanup.policy"])
				}
				if p.LateRecords > 0 {
					ps.Reason = strings.TrimSuffix(fmt.Sprintf("LATE BATCHES: %d records of kmirror's landed after the recorded last mirrored position, "+
						"from a produce request the network held past its sender's lease (first: %s); they repeat source records "+
						"after that position, written after the stop; %s", p.LateRecords, p.LateBatches[0], ps.Reason), "; ")
				}
				if ps.Reason == "" && ps.State == string(raftstore.StateMirroring) {
					ps.Reason = configSyncReason(t)
				}
				if ps.Reason == "" && ps.ConvertedRecords > 0 {
					ps.Reason = fmt.Sprintf("converted %d records from message format v0/v1 (Kafka before 0.11) to v2, which the destination accepts: "+
						"offsets, keys, values and timestamps kept, headers empty", ps.ConvertedRecords)
				}
				if ps.Reason == "" && p.SkippedRecords > 0 {
					ps.Reason = fmt.Sprintf("skipped %d source records deleted before they were mirrored (latest: source offsets %s), as accepted with resume --accept-gap",
						p.SkippedRecords, p.LastGap)
				}
				if mir, ok := s.Mirrors[t.Mirror]; ok && p.State == raftstore.StateStopped {
					if note := hookNote(mir, t.Topic); note != "" {
						ps.Reason = strings.TrimPrefix(ps.Reason+"; "+note, "; ")
					}
				}
				st, ok := live[fetch.Key{Mirror: t.Mirror, Topic: t.Topic, Partition: int32(i)}]
				fillProgress(&ps, st, ok && p.State != raftstore.StateStopped)
				if ps.Reason == "" && ps.State == string(raftstore.StateMirroring) {
					var why []string
					if ps.VerifiedRecords > 0 {
						why = append(why, fmt.Sprintf("verified up to source offset %d (%d records compared by the background verification)", ps.VerifiedUpTo, ps.VerifiedRecords))
					}
					if ps.VerifyNote != "" {
						why = append(why, ps.VerifyNote)
					}
					ps.Reason = strings.Join(why, "; ")
				}
				out = append(out, ps)
			}
		}
	})
	if !mirrorFound {
		return nil, fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, mirror)
	}
	for _, i := range paused {
		ps := &out[i]
		if pos, ok, err := o.engine.Checkpointed(ctx, fetch.Key{Mirror: ps.Mirror, Topic: ps.Topic, Partition: ps.Partition}); err == nil && ok {
			ps.SourceOffset, ps.DestinationOffset = pos.SourceOffset, pos.DestinationOffset
		}
		ps.Reason = "paused by the operator: nothing is fetched; kmirror resume continues from here"
	}
	o.store.Read(func(s *raftstore.State) { out = append(out, SkippedRows(s, mirror, topic)...) })
	if topic != "" && len(out) == 0 {
		return nil, fmt.Errorf("%w: topic %s is not mirrored%s", api.ErrNotFound, topic, inMirror(mirror))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return fetch.Key{Mirror: a.Mirror, Topic: a.Topic, Partition: a.Partition}.Less(
			fetch.Key{Mirror: b.Mirror, Topic: b.Topic, Partition: b.Partition})
	})
	return out, nil
}

// SkippedRows are describe's rows for the topics a mirror's patterns
// match but its last discovery did not add: one each, SKIPPED, partition
// -1, with why (issue 21). mirror and topic filter ("": all).
func SkippedRows(s *raftstore.State, mirror, topic string) []api.PartitionStatus {
	var out []api.PartitionStatus
	for _, mir := range s.Mirrors {
		if mirror != "" && mir.Name != mirror {
			continue
		}
		for t, why := range mir.Skipped {
			if topic == "" || t == topic {
				out = append(out, api.PartitionStatus{Mirror: mir.Name, Topic: t, Partition: -1, State: api.StateSkipped, Reason: why,
					SourceOffset: -1, DestinationOffset: -1, Lag: -1, TimeLagMs: -1, BytesLeft: -1, EtaSeconds: -1})
			}
		}
	}
	return out
}

func inMirror(mirror string) string {
	if mirror == "" {
		return ""
	}
	return " by mirror " + mirror
}

// Translate maps a source offset of a partition this member mirrors to the
// destination offset a consumer continues from.
//
// Any member answers: the request goes to the member that runs the
// partition, which holds its translation in memory.
func (o *Ops) Translate(ctx context.Context, mirror, topic string, partition int32, sourceOffset int64) (api.Translation, error) {
	k := fetch.Key{Mirror: mirror, Topic: topic, Partition: partition}
	owner := ""
	o.store.Read(func(s *raftstore.State) {
		if p, ok := s.Partition(raftstore.PartitionKey{Mirror: k.Mirror, Topic: k.Topic, Partition: k.Partition}); ok {
			owner = p.Owner
		}
	})
	if owner != "" && owner != o.cfg.NodeID && !api.IsForwarded(ctx) {
		c, err := o.member.MemberClient(owner)
		if err != nil {
			return api.Translation{}, err
		}
		return c.Translate(ctx, mirror, topic, partition, sourceOffset)
	}
	d, err := o.engine.Translate(k, sourceOffset)
	var before *fetch.BeforeStartError
	var floor *fetch.BelowFloorError
	switch {
	case errors.As(err, &before), errors.As(err, &floor):
		return api.Translation{}, fmt.Errorf("%w: %v", api.ErrNotFound, err)
	case errors.Is(err, fetch.ErrNotMirroredYet):
		return api.Translation{}, fmt.Errorf("%w: no translation for %s offset %d yet: it is beyond what has been mirrored so far (%v)", api.ErrNotFound, k, sourceOffset, err)
	case err != nil:
		return api.Translation{}, fmt.Errorf("%w: no translation for %s offset %d: the partition is not mirroring right now "+
			"(not added, stopped, or moving between members: see kmirror describe)", api.ErrNotFound, k, sourceOffset)
	}
	return api.Translation{Mirror: mirror, Topic: topic, Partition: partition, SourceOffset: sourceOffset, DestinationOffset: d}, nil
}

// staleAfter is when a partition's live view is shown as stale: a
// healthy owner hears from the source leader at least every fetch wait
// (100 ms; up to fetch.Config.IdleFetchMaxWait, 5 s, while its fetch
// session is idle) and from the destination within produce_timeout.
const staleAfter = 10 * time.Second

// staleness says why a MIRRORING partition's offsets are not current (its
// owner has not heard from the source, or waits on the destination), or
// "" (issue 18: a stalled link showed LAG 0 and no reason).
func staleness(st api.LiveStatus, owner string) string {
	var parts []string
	if wait := time.Duration(st.FetchWaitMs) * time.Millisecond; wait > staleAfter {
		asOf := "never fetched"
		if st.SourceAgeMs >= 0 {
			asOf = "as of " + (time.Duration(st.SourceAgeMs) * time.Millisecond).Round(time.Second).String() + " ago"
		}
		parts = append(parts, fmt.Sprintf("source offset %s: owner %s has waited %s for the source leader to answer a fetch, so the lag is unknown",
			asOf, owner, wait.Round(time.Second)))
	}
	if wait := time.Duration(st.ProduceWaitMs) * time.Millisecond; wait > staleAfter {
		parts = append(parts, fmt.Sprintf("owner %s has waited %s for the destination to answer a produce", owner, wait.Round(time.Second)))
	}
	if len(parts) == 0 {
		return ""
	}
	return "stale: " + strings.Join(parts, "; ")
}
