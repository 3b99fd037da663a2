package leader

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// readOnlyInterval bounds how long a new ALLOW WRITE ACL on a mirror topic
// goes without its DENY, and how long a failed-over topic stays read-only
// when no state change wakes the loop sooner.
const readOnlyInterval = 3 * time.Second

// readOnly keeps mirror topics read-only on the destination (KIP-1279:
// mirror topics are read-only) with stock Kafka's authorizer: while a topic
// is mirrored (any state but STOPPED), every principal that an ALLOW ACL
// lets write it, except kmirror's own, gets a DENY WRITE ACL on the topic,
// which takes precedence over any ALLOW. When the topic is STOPPED
// (failover) or removed, exactly those DENY ACLs go. The leader does it;
// the denied principals are recorded in raft first (State.WriteDenials),
// so a new leader removes what an old one created.
//
// Not covered: super users (the authorizer does not apply ACLs to them)
// and an ALLOW for the wildcard principal User:*, which cannot be denied
// without denying kmirror too; both are reported. Without an authorizer
// (or without the ACLs to manage ACLs), foreign writes are still detected
// and the partition goes DIVERGED.
type readOnly struct {
	// round serializes rounds: the leader's loop and the one a finished
	// remove runs at once.
	round sync.Mutex

	mu sync.Mutex
	// status is the last round's outcome, as the leader logs it.
	status string
	// unprotected counts the mirrored topics the last round could not
	// keep read-only (kmirror_read_only_unprotected_topics); unlifted the
	// topics no longer mirrored whose DENY ACLs it could not delete
	// (kmirror_read_only_unlifted_topics): applications still cannot
	// write them. known is false until this member ran a round as leader.
	unprotected, unlifted int
	known                 bool
	// created is when this leader last created each DENY (by topic and
	// principal): a broker lists a new ACL only once the metadata reached
	// it, so a DENY missing from the listing just after kmirror created it
	// is created again quietly, not reported as deleted by someone.
	created map[[2]string]time.Time
	// adding counts the adds of each topic under way, which lifted its
	// stop fence (stopfence.go).
	adding map[string]int
}

// aclPropagation is how long after creating an ACL its absence from a
// listing is taken for propagation, not a deletion (KRaft brokers apply
// ACL changes from the metadata log within milliseconds to a second).
const aclPropagation = 3 * time.Second

// justCreated reports whether this leader created the DENY of principal on
// topic within aclPropagation; created marks them created now.
func (r *readOnly) justCreated(topic, principal string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Since(r.created[[2]string{topic, principal}]) < aclPropagation
}

func (r *readOnly) markCreated(topic string, principals []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.created == nil {
		r.created = map[[2]string]time.Time{}
	}
	for _, p := range principals {
		r.created[[2]string{topic, p}] = time.Now()
	}
}

// set records a round's outcome; a change is logged, at warn level when
// some mirrored topic is left writable by others or some failed-over topic
// is left read-only.
func (r *readOnly) set(log *zap.Logger, status string, unprotected, unlifted int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if status != r.status {
		if unprotected == 0 && unlifted == 0 {
			log.Info("read-only mirror topics", zap.String("status", status))
		} else {
			log.Warn("read-only mirror topics", zap.String("status", status),
				zap.Int("unprotected_topics", unprotected), zap.Int("unlifted_topics", unlifted))
		}
	}
	r.status, r.unprotected, r.unlifted, r.known = status, unprotected, unlifted, true
}

// gauges returns kmirror_read_only_unprotected_topics and
// kmirror_read_only_unlifted_topics; ok is false on a member that has not
// led a round.
func (r *readOnly) gauges() (unprotected, unlifted int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.unprotected, r.unlifted, r.known
}

// readOnlyLoop reconciles the DENY ACLs while this member leads.
func (l *Leader) readOnlyLoop(ctx context.Context) {
	if l.cfg.DestPrincipal == "" {
		return // a control-plane-only member (tests): no destination
	}
	changed, unwatch := l.store.Watch()
	defer unwatch()
	for {
		l.reconcileReadOnly(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(readOnlyInterval):
		}
	}
}

// liftWait bounds the read-only round a finished remove runs on the
// leader, so that it returns with the topic writable (the leader's loop
// retries what this round leaves).
const liftWait = 10 * time.Second

// LiftReadOnly runs a round at once on the leader, after remove or
// switchover stopped a topic: its DENY ACLs are gone when they return.
func (l *Leader) LiftReadOnly(ctx context.Context) {
	if l.cfg.DestPrincipal == "" || !l.store.IsLeader() {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, liftWait)
	defer cancel()
	l.reconcileReadOnly(lctx)
}

// reconcileReadOnly runs one round: deny the writers of mirrored topics,
// lift the denials of topics no longer mirrored.
func (l *Leader) reconcileReadOnly(ctx context.Context) {
	l.readOnly.round.Lock()
	defer l.readOnly.round.Unlock()
	active := map[string]bool{}
	var denials map[string][]string
	var fences map[string]string
	var stopped []string
	l.store.Read(func(s *raftstore.State) {
		for _, t := range s.Topics {
			if t.State != raftstore.StateStopped {
				active[t.Topic] = true
			}
		}
		for _, t := range sortedTopics(s) {
			if t.State == raftstore.StateStopped && !active[t.Topic] {
				stopped = append(stopped, t.Topic)
			}
		}
		denials, fences = s.WriteDenials, s.StopFences
	})
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	// Fence, then lift: a failover is waiting for it, and no batch of
	// kmirror's may land once applications can write (stopfence.go).
	hold, fenceErr := l.fenceStopped(cctx, stopped, fences)
	var unlifted []string
	var liftErr error
	for _, topic := range slices.Sorted(maps.Keys(denials)) {
		principals := denials[topic]
		if active[topic] {
			continue
		}
		if hold[topic] {
			unlifted, liftErr = append(unlifted, topic), fmt.Errorf("the stop fence (a DENY WRITE ACL for kmirror's own principal) "+
				"must be in place first, and creating it failed: %w", fenceErr)
			continue
		}
		if err := l.dest.RemoveDenyWrite(cctx, topic, principals); err != nil {
			unlifted, liftErr = append(unlifted, topic), err
			continue
		}
		if err := l.store.Apply(cctx, raftstore.SetWriteDenials{Topic: topic}); err != nil {
			return // retried next round; deleting again is harmless
		}
		l.log.Info("mirror topic writable again: DENY WRITE ACLs removed", zap.String("topic", topic), zap.Strings("principals", principals))
	}
	unliftedStatus := ""
	if len(unlifted) > 0 {
		unliftedStatus = "; failed-over or removed topics " + strings.Join(unlifted, ", ") + " are still read-only for other principals: " +
			readOnlyError(liftErr, "to make them writable again")
	}
	set := func(status string, unprotected int) {
		l.readOnly.set(l.log, status+unliftedStatus, unprotected, len(unlifted))
	}
	if len(active) == 0 {
		set("no mirrored topics", 0)
		return
	}
	own := l.cfg.DestPrincipal
	var wildcard []string
	denied := 0
	topics := slices.Sorted(maps.Keys(active))
	writers, err := l.dest.TopicWriteACLs(cctx, topics)
	if err != nil {
		set("not enforced: "+readOnlyError(err, "to keep mirror topics read-only"), len(active))
		return
	}
	for _, topic := range topics {
		existing := writers[topic].Denied
		var want []string
		for _, p := range writers[topic].Allowed {
			switch {
			case p == own:
			case p == "User:*":
				wildcard = append(wildcard, topic)
			default:
				want = append(want, p)
			}
		}
		have := denials[topic]
		// Compared with the ACLs that exist, not with the record: a DENY
		// someone deleted is created again.
		var missing, recreated, unrecorded []string
		for _, p := range want {
			switch {
			case slices.Contains(existing, p):
			case slices.Contains(have, p) && l.readOnly.justCreated(topic, p):
				missing = append(missing, p) // not listed yet: created again, harmlessly
			case slices.Contains(have, p):
				missing, recreated = append(missing, p), append(recreated, p)
			default:
				missing, unrecorded = append(missing, p), append(unrecorded, p)
			}
		}
		if len(missing) > 0 {
			// Record, then create: a crash between leaves a record of an
			// ACL that may not exist, whose deletion is harmless.
			if len(unrecorded) > 0 {
				if err := l.store.Apply(cctx, raftstore.SetWriteDenials{Topic: topic, Principals: append(slices.Clone(have), unrecorded...)}); err != nil {
					return
				}
			}
			if err := l.dest.DenyWrite(cctx, topic, missing); err != nil {
				set("not enforced on "+topic+": "+readOnlyError(err, "to keep mirror topics read-only"), len(active))
				return
			}
			l.readOnly.markCreated(topic, unrecorded) // the first creation only: a re-creation does not extend the window
			if len(recreated) > 0 {
				l.log.Warn("mirror topic read-only: DENY WRITE ACLs kmirror had added were deleted by someone; added again",
					zap.String("topic", topic), zap.Strings("principals", recreated))
			}
			l.log.Info("mirror topic read-only: DENY WRITE ACLs added", zap.String("topic", topic), zap.Strings("principals", missing))
		}
		denied += len(want)
	}
	status := "enforced: " + strconv.Itoa(denied) + " DENY WRITE ACLs on " + strconv.Itoa(len(active)) + " mirror topics (kmirror writes as " + own + ")"
	if len(wildcard) > 0 {
		status += "; User:* may write " + strings.Join(wildcard, ", ") + " through an ALLOW ACL for every principal, which kmirror cannot deny " +
			"without denying itself: replace that ACL with ACLs for named principals"
	}
	set(status, len(wildcard))
}

// readOnlyError says why managing the DENY ACLs failed and what to do;
// purpose completes "grant it ... " (what the ACLs are needed for).
func readOnlyError(err error, purpose string) string {
	var kerr *kwire.Error
	switch {
	case errors.Is(err, kafka.ErrNoAuthorizer):
		return "the destination cluster runs no authorizer, so mirror topics cannot be made read-only; " +
			"foreign writes are still detected (the partition goes DIVERGED)"
	case errors.As(err, &kerr) && kwire.IsAuthorization(kerr.Code):
		return "kmirror's principal may not manage ACLs on the destination: grant it DESCRIBE and ALTER on the CLUSTER resource " +
			"(README, Least-privilege ACLs) " + purpose + " (" + err.Error() + ")"
	}
	return err.Error()
}
