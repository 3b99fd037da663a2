package ops

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// switchoverPoll is how often a planned switchover checks lag and groups;
// switchoverQuiet is how long the source's last stable offsets must stay
// unchanged before it counts the producers as stopped (writes after that
// are caught by the check after the stop).
const (
	switchoverPoll  = 500 * time.Millisecond
	switchoverQuiet = time.Second
)

// SwitchoverTopic is remove --wait-for-sync, a planned switchover
// (design.md section 8): it keeps the topic mirroring until every
// partition has mirrored up to the source's last stable offset, that
// offset has stopped moving (the producers were stopped at the source),
// for switchoverQuiet, and a group sync that began after that point found
// every group of the topic synced; then it stops the topic as RemoveTopic does. If that does
// not happen within timeout it fails with ErrConflict, naming what is
// missing, and nothing is stopped.
func (o *Ops) SwitchoverTopic(ctx context.Context, mirror, topic string, timeout time.Duration) ([]string, error) {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return nil, err
		}
		return c.SwitchoverTopic(ctx, mirror, topic, timeout)
	}
	var state raftstore.TopicState
	var mir *raftstore.Mirror
	partitions := 0
	o.store.Read(func(s *raftstore.State) {
		if t, ok := s.Topic(mirror, topic); ok {
			state, partitions = t.State, len(t.Partitions)
			mir = s.Mirrors[mirror].Clone()
		}
	})
	switch {
	case mir == nil:
		return nil, fmt.Errorf("%w: mirror %s has no topic %s (see kmirror describe --mirror %s)", api.ErrNotFound, mirror, topic, mirror)
	case state == raftstore.StateStopped:
		return nil, nil
	case state == raftstore.StateStopping:
		return nil, o.waitStopped(ctx, mirror, topic)
	case state != raftstore.StateMirroring:
		return nil, fmt.Errorf("%w: topic %s of mirror %s is %s: a planned switchover needs it MIRRORING (see kmirror describe); "+
			"remove it without --wait-for-sync for an emergency failover", api.ErrConflict, topic, mirror, state)
	}
	settings, err := mirrorprops.Parse(mir.Name, mir.Properties)
	if err != nil {
		return nil, err
	}
	if least := switchoverQuiet + settings.GroupSyncInterval + switchoverPoll; timeout < least {
		return nil, fmt.Errorf("%w: a planned switchover of mirror %s needs at least %s (the source quiet for %s, then one group sync: "+
			"groups.sync.interval=%s): give --wait-for-sync=%s or more", api.ErrInvalid, mirror, least, switchoverQuiet, settings.GroupSyncInterval, least)
	}
	src := o.member.SourceAdmin(*mir)
	defer src.Close()
	w := switchoverWait{o: o, src: src, mirror: mirror, topic: topic, partitions: partitions}
	deadline := time.Now().Add(timeout)
	for {
		why := w.blocker(ctx)
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: planned switchover of %s (mirror %s) did not complete within %s: %s. Nothing was stopped: the topic is "+
				"still MIRRORING; run remove --wait-for-sync again once that is dealt with, or remove without it for an emergency failover",
				api.ErrConflict, topic, mirror, timeout, why)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(switchoverPoll):
		}
	}
	o.log.Info("planned switchover: caught up with the source and groups synced; stopping", zap.String("mirror", mirror),
		zap.String("topic", topic), zap.Int64s("source_last_stable_offsets", w.lastStable))
	if err := o.store.Apply(ctx, raftstore.SetTopicState{Mirror: mirror, Topic: topic, State: raftstore.StateStopping,
		Reason: raftstore.ReasonSwitchover}); err != nil {
		return nil, StoreErr(err)
	}
	if err := o.waitStopped(ctx, mirror, topic); err != nil {
		return nil, err
	}
	return w.aheadNotes(), w.checkNoneLeft(ctx)
}

// switchoverWait tracks a planned switchover's conditions across polls.
type switchoverWait struct {
	o             *Ops
	src           *kafka.Admin
	mirror, topic string
	partitions    int
	// lastStable is the source's last stable offsets at the previous
	// poll; caughtUp is when every partition was first seen mirrored up
	// to them with them unchanged.
	lastStable  []int64
	stableSince time.Time
	caughtUp    time.Time
	// ahead are the group partitions whose destination commit is ahead of
	// the source's translated commit, by "group partition": they need
	// nothing from the switchover, and its reply says so.
	ahead map[string]string
}

// aheadNotes says which groups counted as synced because the destination
// is ahead.
func (w *switchoverWait) aheadNotes() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(w.ahead)) {
		out = append(out, w.ahead[k])
	}
	return out
}

// blocker returns what keeps the switchover from stopping the topic now,
// or "".
func (w *switchoverWait) blocker(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	stable, err := w.src.Offsets(cctx, w.topic, w.partitions, kafka.Latest)
	if err != nil {
		w.caughtUp = time.Time{}
		return "the source's last stable offsets are unknown: " + err.Error()
	}
	if w.lastStable == nil || !slices.Equal(stable, w.lastStable) {
		moved := w.lastStable != nil
		w.lastStable, w.stableSince, w.caughtUp = stable, time.Now(), time.Time{}
		if moved {
			return "the source's last stable offset is still moving: stop the producers of the topic on the source first"
		}
	}
	if time.Since(w.stableSince) < switchoverQuiet {
		return fmt.Sprintf("waiting for the source's last stable offset to stay put for %s (producers stopped)", switchoverQuiet)
	}
	live, _ := w.o.member.LiveStatuses(cctx)
	var behind []string
	for p := 0; p < w.partitions; p++ {
		st, ok := live[fetch.Key{Mirror: w.mirror, Topic: w.topic, Partition: int32(p)}]
		switch {
		case !ok:
			behind = append(behind, fmt.Sprintf("partition %d: its owner did not report", p))
		case st.State != string(fetch.Mirroring):
			behind = append(behind, fmt.Sprintf("partition %d is %s", p, st.State))
		case st.SourcePosition < stable[p]:
			behind = append(behind, fmt.Sprintf("partition %d mirrored up to source offset %d of %d", p, st.SourcePosition, stable[p]))
		}
	}
	if len(behind) > 0 {
		w.caughtUp = time.Time{}
		return "not caught up with the source: " + strings.Join(behind, "; ")
	}
	if w.caughtUp.IsZero() {
		w.caughtUp = time.Now()
	}
	rows, err := w.o.DescribeGroups(cctx, w.mirror)
	if err != nil {
		return "group sync unknown: " + err.Error()
	}
	var unsynced []string
	for _, r := range rows {
		if r.Topic != w.topic {
			continue
		}
		switch {
		case r.State == api.GroupConflict && r.Ahead && r.SyncedAtMs >= w.caughtUp.UnixMilli():
			// Consumers on the destination read past what the source
			// group committed: it loses nothing by the switchover.
			if w.ahead == nil {
				w.ahead = map[string]string{}
			}
			w.ahead[fmt.Sprintf("%s %09d", r.Group, r.Partition)] = fmt.Sprintf("group %s partition %d: the destination's commit %d is ahead of "+
				"the source's (%d): left as it is, it loses no records", r.Group, r.Partition, r.DestinationCommitted, r.SourceCommitted)
		case r.Unsupported:
			// Nothing kmirror can carry: the result names it.
			if w.ahead == nil {
				w.ahead = map[string]string{}
			}
			w.ahead[fmt.Sprintf("%s %09d", r.Group, r.Partition)] = fmt.Sprintf("group %s partition %d: %s", r.Group, r.Partition, r.Reason)
		case r.State != api.GroupSynced:
			unsynced = append(unsynced, fmt.Sprintf("group %s partition %d is %s (%s)", r.Group, r.Partition, r.State, r.Reason))
		case r.SyncedAtMs < w.caughtUp.UnixMilli():
			unsynced = append(unsynced, fmt.Sprintf("group %s partition %d: waiting for a sync after the topic caught up", r.Group, r.Partition))
		}
	}
	if len(unsynced) > 0 {
		return "groups not synced: " + strings.Join(unsynced, "; ")
	}
	return ""
}

// checkNoneLeft compares the recorded last mirrored positions with the
// source once the topic is STOPPED: records the source took between the
// last check and the stop are not on the destination, and the operator
// must hear of it.
func (w *switchoverWait) checkNoneLeft(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	stable, err := w.src.Offsets(cctx, w.topic, w.partitions, kafka.Latest)
	if err != nil {
		return nil // the positions are recorded; the source can no longer be asked
	}
	var left []string
	w.o.store.Read(func(s *raftstore.State) {
		t, ok := s.Topic(w.mirror, w.topic)
		if !ok {
			return
		}
		for p, pi := range t.Partitions {
			if pi.LastMirrored != nil && p < len(stable) && stable[p] > pi.LastMirrored.SourceOffset {
				left = append(left, fmt.Sprintf("partition %d: mirrored up to %d, the source is at %d", p, pi.LastMirrored.SourceOffset, stable[p]))
			}
		}
	})
	if len(left) > 0 {
		return fmt.Errorf("%w: topic %s of mirror %s is STOPPED, but the source took records after the last sync check that are not on "+
			"the destination (%s): a producer wrote to the source during the switchover", api.ErrConflict, w.topic, w.mirror, strings.Join(left, "; "))
	}
	return nil
}
