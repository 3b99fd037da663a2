package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"github.com/kmirror/kmirror/truncate"
)

// plannedTopic is a topic checked and resolved by AddTopics before anything
// is created.
type plannedTopic struct {
	topic raftstore.MirrorTopic
	// existing is set when the destination topic exists and kmirror
	// wrote it (a stopped mirror's last positions name it): mirroring
	// continues from there, or truncates (truncate.Find).
	existing *truncate.Plan
}

// AddTopics starts mirroring topics. Every topic is checked first (source
// topic exists; destination topic absent, or one kmirror wrote and whose
// last mirrored position it finds); only then is anything created, so a
// bad request leaves nothing half-done.
func (o *Ops) AddTopics(ctx context.Context, req api.AddTopicsRequest) (api.AddResult, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return api.AddResult{}, err
		}
		return c.AddTopics(ctx, req)
	}
	req.DryRun = false
	if len(req.Include) > 0 || len(req.Exclude) > 0 {
		return o.addPatterns(ctx, req)
	}
	res := api.AddResult{Status: "added"}
	_, err := o.addTopics(ctx, req, &res)
	return res, err
}

// PlanTopics is add --dry-run: what AddTopics would do with each topic,
// changing nothing.
func (o *Ops) PlanTopics(ctx context.Context, req api.AddTopicsRequest) ([]truncate.Plan, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return nil, err
		}
		return c.PlanTopics(ctx, req)
	}
	req.DryRun = true
	if len(req.Include) > 0 || len(req.Exclude) > 0 {
		if _, err := compilePatterns("--include", req.Include); err != nil {
			return nil, err
		}
		if _, err := compilePatterns("--exclude", req.Exclude); err != nil {
			return nil, err
		}
		return o.planPatterns(ctx, req)
	}
	return o.addTopics(ctx, req, nil)
}

func (o *Ops) addTopics(ctx context.Context, req api.AddTopicsRequest, res *api.AddResult) ([]truncate.Plan, error) {
	if len(req.Topics) == 0 {
		return nil, fmt.Errorf("%w: name at least one --topic", api.ErrInvalid)
	}
	which := kafka.Earliest
	switch req.StartFrom {
	case "", "earliest":
	case "latest":
		which = kafka.Latest
	default:
		return nil, fmt.Errorf("%w: start-from %q: use earliest or latest", api.ErrInvalid, req.StartFrom)
	}
	var mir raftstore.Mirror
	found := false
	taken, stopped := map[string]string{}, map[string]string{}
	o.store.Read(func(s *raftstore.State) {
		if p, ok := s.Mirrors[req.Mirror]; ok {
			mir, found = *p, true
		}
		for _, t := range s.Topics {
			if t.State == raftstore.StateStopped {
				stopped[t.Topic] = t.Mirror
				continue // removed: it may be added again (and start over)
			}
			taken[t.Topic] = t.Mirror
		}
	})
	if !found {
		return nil, fmt.Errorf("%w: mirror %s does not exist (create it with kmirror create)", api.ErrNotFound, req.Mirror)
	}
	// Every topic is checked; a dry run reports each topic's refusal in
	// its plan, a real add stops at the first.
	var plan []plannedTopic
	var plans []truncate.Plan
	var refused []string
	refuse := func(topic string, err error) error {
		if !req.DryRun {
			return err
		}
		plans = append(plans, truncate.Plan{Mirror: req.Mirror, Topic: topic, Kind: truncate.KindRefused, Reason: err.Error()})
		return nil
	}
	src := o.member.SourceAdmin(mir)
	defer src.Close()
	gctx, gcancel := context.WithTimeout(ctx, adminTimeout)
	loop, err := o.loopGuard(gctx, src, mir)
	gcancel()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, t := range req.Topics {
		var err error
		owner, isTaken := taken[t]
		switch {
		case seen[t]:
			err = fmt.Errorf("%w: topic %s named twice", api.ErrInvalid, t)
		case isTaken:
			err = fmt.Errorf("%w: topic %s is already mirrored by mirror %s", api.ErrExists, t, owner)
		case strings.HasPrefix(t, "__"):
			err = fmt.Errorf("%w: topic %s is internal: kmirror mirrors only user topics", api.ErrInvalid, t)
		default:
			err = loop(t)
		}
		seen[t] = true
		var p plannedTopic
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, adminTimeout)
			p, err = o.planTopic(pctx, src, mir, t, which, stopped[t] == req.Mirror)
			cancel()
		}
		if err == nil && req.Discovery && p.existing != nil && p.existing.Kind == truncate.KindFailback {
			// Which cluster is writable for a topic is the operator's
			// call: a pattern does not fail a topic back on its own
			// (issue 21 review: it did, right after a failover).
			err = fmt.Errorf("%w: %s was mirrored the other way by mirror %s (a failover): patterns do not fail a topic back by "+
				"themselves; kmirror add --mirror %s --topic %s --dry-run shows the failback, and without --dry-run does it",
				api.ErrConflict, t, p.existing.From, req.Mirror, t)
		}
		if err != nil {
			if rerr := refuse(t, err); rerr != nil {
				return nil, rerr
			}
			continue
		}
		plan = append(plan, p)
		pl := truncate.Plan{Mirror: req.Mirror, Topic: t, Kind: truncate.KindNew}
		if p.existing != nil {
			pl = *p.existing
			if p.existing.Divergent() {
				refused = append(refused, divergentText(p.existing))
				if req.DryRun {
					gctx, cancel := context.WithTimeout(ctx, adminTimeout)
					pos, err := truncate.GroupPositions(gctx, o.dest, p.existing)
					cancel()
					pl.Groups = pos
					if err != nil {
						pl.GroupsNote = err.Error()
					}
				}
			}
		}
		plans = append(plans, pl)
	}
	if req.DryRun {
		return plans, nil
	}
	if len(refused) > 0 && !req.Truncate {
		return nil, fmt.Errorf("%w: %s. Nothing was added: kmirror add --dry-run shows the plan; kmirror add --truncate copies the divergent "+
			"records into a quarantine topic TOPIC.kmirror-diverged.N, deletes the destination topic and mirrors it again from the source",
			api.ErrConflict, strings.Join(refused, "; "))
	}
	// Past this point an add runs to its end even if the client gives up
	// (issue 18: a CLI timeout cancelled a big add midway and left a topic
	// half-undone); each topic is bounded on its own.
	wctx := context.WithoutCancel(ctx)
	var failed error
	for _, p := range plan {
		r, err := o.addPlanned(wctx, src, mir, p, stopped, req.ReplicationFactor, res)
		res.Topics = append(res.Topics, r)
		if err != nil && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		return nil, fmt.Errorf("%w. %s", failed, addSummary(res.Topics))
	}
	return plans, nil
}

// addPlanned adds one checked topic: new, continued from its last
// mirrored position, or truncated and added afresh. A topic ends
// MIRRORING, PENDING (its destination topic may exist: the leader finishes
// it, FinishPending) or not added at all, never in between.
func (o *Ops) addPlanned(ctx context.Context, src *kafka.Admin, mir raftstore.Mirror, p plannedTopic, stopped map[string]string, rf int16,
	res *api.AddResult) (api.AddedTopic, error) {
	r := api.AddedTopic{Topic: p.topic.Topic, Result: api.TopicAdded}
	defer o.markAdding(raftstore.TopicKey(mir.Name, p.topic.Topic))()
	// A topic stopped before carries the stop fence (a DENY WRITE for
	// kmirror's own principal) on the destination: lifted first.
	lctx, lcancel := context.WithTimeout(ctx, adminTimeout)
	lifted, err := o.lead.LiftStopFence(lctx, p.topic.Topic)
	lcancel()
	defer lifted()
	if err != nil {
		err = fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	if owner, ok := stopped[p.topic.Topic]; err == nil && ok && owner == mir.Name && (p.existing == nil || !p.existing.Divergent()) {
		// Mirrored before and removed: its old checkpoints and translation
		// must not be taken for the new start (a continued one is seeded
		// from what was read). A truncation forgets them itself once the
		// topic is deleted: until then they map its groups' positions, also
		// for an add --truncate tried again after a refusal.
		fctx, cancel := context.WithTimeout(ctx, adminTimeout)
		err = o.engine.ForgetTopic(fctx, mir.Name, p.topic.Topic)
		cancel()
		if err != nil {
			err = fmt.Errorf("%w: clearing the earlier mirroring of %s from the offsets topic: %v", api.ErrUnavailable, p.topic.Topic, err)
		}
	}
	if err == nil {
		// Recorded before the topic is: a group beside the source that
		// reads it refuses to mirror the topic back (loops.go).
		actx, cancel := context.WithTimeout(ctx, adminTimeout)
		if err = o.recordActive(actx, mir, p.topic.SourceTopicID, p.topic.Topic); err != nil {
			err = fmt.Errorf("%w: recording %s as mirrored in the destination's %s: %v", api.ErrUnavailable, p.topic.Topic, truncate.StateTopic, err)
		}
		cancel()
	}
	if err == nil {
		switch {
		case p.existing != nil && p.existing.Divergent():
			var tr truncate.Result
			tr, err = o.truncateAndAdd(ctx, src, mir, p, rf)
			if tr.Quarantine != "" {
				res.Truncated = append(res.Truncated, tr)
			}
		case p.existing != nil:
			err = o.continueTopic(ctx, p)
		default:
			err = o.createTopic(ctx, p, rf)
		}
	}
	var pending *pendingError
	switch {
	case errors.As(err, &pending):
		r.Result, r.Error, err = api.TopicPending, pending.Error(), nil
	case err != nil:
		r.Result, r.Error = api.TopicNotAdded, err.Error()
		// Not mirrored: its active record must not make the other side
		// refuse to mirror it (the next config sync round deletes it
		// too, should this fail). Unless the topic is recorded after all
		// (an error after it was, or another add of it won).
		if !o.mirrored(mir.Name, p.topic.Topic) {
			o.forgetActive(ctx, mir.Name, p.topic.Topic)
		}
	}
	return r, err
}

// addSummary says what became of each topic of a failed add.
func addSummary(topics []api.AddedTopic) string {
	by := map[string][]string{}
	for _, t := range topics {
		by[t.Result] = append(by[t.Result], t.Topic)
	}
	var parts []string
	for _, r := range []string{api.TopicAdded, api.TopicPending, api.TopicNotAdded} {
		if len(by[r]) > 0 {
			parts = append(parts, r+": "+strings.Join(by[r], ", "))
		}
	}
	out := "Per topic: " + strings.Join(parts, "; ")
	if len(by[api.TopicPending]) > 0 {
		out += " (pending topics are finished by the leader; kmirror describe shows them)"
	}
	return out
}

// pendingError is a creation whose outcome is unknown: the topic stays
// PENDING, and the leader finishes it.
type pendingError struct{ err error }

func (e *pendingError) Error() string {
	return "the destination topic's creation did not answer (" + e.err.Error() + "): the topic stays PENDING and the leader finishes it"
}

func (o *Ops) planTopic(ctx context.Context, src *kafka.Admin, mir raftstore.Mirror, topic string, which int64, removed bool) (plannedTopic, error) {
	if !validName.MatchString(topic) || topic == "." || topic == ".." {
		return plannedTopic{}, fmt.Errorf("%w: topic name %q: Kafka topic names are 1-249 characters of A-Z a-z 0-9 . _ - (not . or ..)", api.ErrInvalid, topic)
	}
	srcTopic, err := src.Topic(ctx, topic)
	n := srcTopic.Partitions
	if errors.Is(err, kafka.ErrTopicNotFound) {
		return plannedTopic{}, fmt.Errorf("%w: source topic %s does not exist on the source cluster of mirror %s (%s)",
			api.ErrNotFound, topic, mir.Name, strings.Join(mir.Bootstrap, ","))
	}
	if err != nil {
		return plannedTopic{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	if _, err := o.dest.Partitions(ctx, topic); err == nil {
		existing, err := o.findExisting(ctx, src, mir, topic)
		if err != nil {
			return plannedTopic{}, fmt.Errorf("%w: looking for the last mirrored position of %s: %v", api.ErrUnavailable, topic, err)
		}
		if existing != nil {
			return o.existingTopic(mir, srcTopic, existing), nil
		}
	}
	if _, err := o.dest.Partitions(ctx, topic); err == nil && removed {
		return plannedTopic{}, fmt.Errorf("%w: destination topic %s was mirrored by mirror %s, but its last mirrored position does not "+
			"match the source topic any more (was the source topic recreated?): to mirror the topic again from the start, delete it on "+
			"the destination cluster first", api.ErrConflict, topic, mir.Name)
	} else if err == nil {
		return plannedTopic{}, fmt.Errorf("%w: destination topic %s already exists and no last mirrored position of it was found "+
			"(neither in the destination's nor in the source's %s for these clusters and topic IDs): it was not written by kmirror; "+
			"delete it on the destination cluster or mirror into a cluster without it", api.ErrConflict, topic, truncate.StateTopic)
	} else if !errors.Is(err, kafka.ErrTopicNotFound) {
		return plannedTopic{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	offsets, err := src.Offsets(ctx, topic, n, which)
	if err != nil {
		return plannedTopic{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	configs, err := src.TopicConfigs(ctx, topic)
	if err != nil {
		return plannedTopic{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	create, deferred := kafka.DeferCompaction(configs)
	mt := raftstore.MirrorTopic{Mirror: mir.Name, Topic: topic, State: raftstore.StatePending,
		SourceTopicID: srcTopic.ID, DestinationConfigs: create, Partitions: make([]raftstore.PartitionInfo, n)}
	if deferred != nil {
		if mt.DeferUntil, err = src.HighWatermarks(ctx, topic, n); err != nil {
			return plannedTopic{}, fmt.Errorf("%w: %v", api.ErrUnavailable, err)
		}
		mt.DeferredConfigs = deferred
	}
	for i := range mt.Partitions {
		mt.Partitions[i] = raftstore.PartitionInfo{State: raftstore.StatePending, StartOffset: offsets[i]}
	}
	return plannedTopic{topic: mt}, nil
}

// createTopic records the topic PENDING, creates the destination topic and
// moves it to MIRRORING; if the broker refuses the creation, the record is
// removed again; if it does not answer, the topic stays PENDING
// (*pendingError).
// A leader that stops in between leaves the topic PENDING, and the next
// leader finishes it (FinishPending) with the same configs and
// replication factor, which the record carries.
func (o *Ops) createTopic(ctx context.Context, p plannedTopic, rf int16) error {
	t := p.topic
	key := raftstore.TopicKey(t.Mirror, t.Topic)
	defer o.markCreating(key)()
	if rf == 0 {
		rf = o.cfg.ReplicationFactor
	}
	t.ReplicationFactor = rf
	if err := o.store.Apply(ctx, raftstore.AddTopic{Topic: t}); err != nil {
		return StoreErr(err)
	}
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	destID, err := o.createDestination(cctx, t)
	if err != nil {
		if !kafka.IsRequestError(err) && !kafka.IsTopicExists(err) {
			// The broker may have created it: keep the record, which the
			// leader finishes (adopting the topic if it exists).
			return &pendingError{err: err}
		}
		if rerr := o.store.Apply(ctx, raftstore.RemoveTopic{Mirror: t.Mirror, Topic: t.Topic}); rerr != nil {
			o.log.Error("undo add topic", zap.String("topic", t.Topic), zap.Error(rerr))
		}
		return destinationError(t.Topic, err)
	}
	return StoreErr(o.store.Apply(ctx, raftstore.SetTopicState{Mirror: t.Mirror, Topic: t.Topic,
		State: raftstore.StateMirroring, DestTopicID: destID}))
}

// createDestination creates the destination topic of t with its recorded
// configs and replication factor and returns its topic ID.
func (o *Ops) createDestination(ctx context.Context, t raftstore.MirrorTopic) (string, error) {
	configs := t.DestinationConfigs
	if len(configs) == 0 {
		configs = kafka.MirrorTopicConfigs // recorded by an older build
	}
	rf := t.ReplicationFactor
	if rf == 0 {
		rf = o.cfg.ReplicationFactor
	}
	if err := o.dest.CreateTopic(ctx, t.Topic, len(t.Partitions), rf, configs); err != nil {
		return "", err
	}
	tm, err := o.dest.Topic(ctx, t.Topic)
	if err != nil {
		return "", err
	}
	return tm.ID, nil
}

// destinationError maps a failed destination topic creation to the API's
// errors: a request the broker refuses as given (bad name, replication
// factor above the broker count, a config it refuses) is the caller's to
// fix (400); a topic someone created meanwhile is a conflict (409); the
// rest is the destination being unavailable (502).
func destinationError(topic string, err error) error {
	switch {
	case kafka.IsRequestError(err):
		return fmt.Errorf("%w: the destination cluster refused to create topic %s: %v", api.ErrInvalid, topic, err)
	case kafka.IsTopicExists(err):
		return fmt.Errorf("%w: destination topic %s already exists (created by someone else meanwhile): %v; "+
			"delete it on the destination cluster or mirror into a cluster without it", api.ErrConflict, topic, err)
	}
	return fmt.Errorf("%w: %v", api.ErrUnavailable, err)
}

// pendingRetry is how often the leader retries creating the destination
// topic of a PENDING topic whose creation failed.
const pendingRetry = 10 * time.Second
