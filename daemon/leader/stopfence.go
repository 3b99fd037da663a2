package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// The stop fence (issue 19). A produce request that the network held past
// its sender's lease is authorized by the broker when it arrives, with the
// principal of the connection it came on: kmirror's. Where the
// destination runs an authorizer, a STOPPED topic therefore gets a DENY
// WRITE ACL for kmirror's own principal before the DENY ACLs that kept
// other principals out are lifted: from the moment applications may write
// the topic, no batch of kmirror's can land in it. A late batch that
// arrives before that lands before any application record, and is named
// (latebatch.go). An add of the topic lifts the fence before it records
// anything (LiftStopFence). Not fenced: a group whose destination
// principal is User:ANONYMOUS (denying it would deny every client of a
// PLAINTEXT listener), and a destination without an authorizer.

// fenceable reports whether kmirror's own principal can be denied.
func (l *Leader) fenceable() bool {
	own := l.cfg.DestPrincipal
	return own != "" && own != "User:ANONYMOUS"
}

// fenceStopped puts the stop fence on every STOPPED topic that lacks it;
// hold lists the topics whose fence is not in place yet (their other
// principals' DENY ACLs must stay), err says why.
func (l *Leader) fenceStopped(ctx context.Context, stopped []string, fences map[string]string) (hold map[string]bool, err error) {
	own := l.cfg.DestPrincipal
	hold = map[string]bool{}
	if !l.fenceable() {
		return hold, nil
	}
	var unfenced []string
	for _, topic := range stopped {
		if fences[topic] != own && !l.readOnly.isAdding(topic) {
			unfenced = append(unfenced, topic)
		}
	}
	if len(unfenced) == 0 {
		return hold, nil
	}
	// Without an authorizer there is nothing to fence with: found by a
	// read, so such a cluster costs no raft write per round.
	if _, err := l.dest.TopicWriteACLs(ctx, unfenced[:1]); errors.Is(err, kafka.ErrNoAuthorizer) {
		return hold, nil
	}
	var created []string
	for _, topic := range unfenced {
		// Record, then create: a new leader lifts a recorded fence on add
		// even if this one crashed before creating it.
		if err = l.store.Apply(ctx, raftstore.SetStopFence{Topic: topic, Principal: own}); err == nil {
			err = l.dest.DenyWrite(ctx, topic, []string{own})
		}
		if errors.Is(err, kafka.ErrNoAuthorizer) {
			// The read above failed otherwise and left this to find out:
			// nothing to fence with, nothing to lift either.
			if cerr := l.store.Apply(ctx, raftstore.SetStopFence{Topic: topic}); cerr != nil {
				l.log.Debug("clear a stop fence record", zap.String("topic", topic), zap.Error(cerr))
			}
			return hold, nil
		}
		if err != nil {
			for _, t := range stopped {
				if fences[t] != own && !slices.Contains(created, t) {
					hold[t] = true
				}
			}
			break
		}
		created = append(created, topic)
	}
	if len(created) > 0 {
		l.waitListed(ctx, created, own, true)
		l.log.Info("stopped topics fenced: DENY WRITE ACL for kmirror's own principal, so no late produce request of kmirror's lands in them",
			zap.Strings("topics", created), zap.String("principal", own))
	}
	return hold, err
}

// waitListed waits, up to aclPropagation, until the destination lists (or,
// with listed false, no longer lists) the DENY WRITE of principal on every
// one of topics: brokers apply an ACL change within a second of the
// controller.
func (l *Leader) waitListed(ctx context.Context, topics []string, principal string, listed bool) {
	for end := time.Now().Add(aclPropagation); time.Now().Before(end); sleepCtx(ctx, 100*time.Millisecond) {
		w, err := l.dest.TopicWriteACLs(ctx, topics)
		if err != nil {
			continue
		}
		done := true
		for _, t := range topics {
			done = done && slices.Contains(w[t].Denied, principal) == listed
		}
		if done {
			return
		}
	}
}

// LiftStopFence deletes the stop fence of topic before an add of it
// records anything: kmirror writes the topic again. Until done is called
// (the add finished), the read-only rounds do not fence the topic again
// while it is still STOPPED. Errors say what to do; without an
// authorizer, or without a fence, it does nothing.
func (l *Leader) LiftStopFence(ctx context.Context, topic string) (done func(), err error) {
	l.readOnly.setAdding(topic, true)
	done = func() { l.readOnly.setAdding(topic, false) }
	if err := l.liftStopFence(ctx, topic); err != nil {
		done()
		return func() {}, err
	}
	return done, nil
}

func (l *Leader) liftStopFence(ctx context.Context, topic string) error {
	principal := ""
	l.store.Read(func(s *raftstore.State) { principal = s.StopFences[topic] })
	if principal == "" {
		return nil
	}
	if err := l.dest.RemoveDenyWrite(ctx, topic, []string{principal}); err != nil && !errors.Is(err, kafka.ErrNoAuthorizer) {
		return fmt.Errorf("topic %s carries the DENY WRITE ACL for kmirror's principal %s that its stop put there, and deleting it failed: %s",
			topic, principal, readOnlyError(err, "to lift it"))
	}
	l.waitListed(ctx, []string{topic}, principal, false)
	if err := l.store.Apply(ctx, raftstore.SetStopFence{Topic: topic}); err != nil {
		return fmt.Errorf("clear the stop fence record of topic %s: %w", topic, err)
	}
	l.log.Info("stop fence lifted: kmirror writes the topic again", zap.String("topic", topic), zap.String("principal", principal))
	return nil
}

// isAdding reports whether an add of topic is lifting its stop fence or
// has not finished since (LiftStopFence).
func (r *readOnly) isAdding(topic string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adding[topic] > 0
}

func (r *readOnly) setAdding(topic string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.adding == nil {
		r.adding = map[string]int{}
	}
	if on {
		r.adding[topic]++
	} else if r.adding[topic]--; r.adding[topic] <= 0 {
		delete(r.adding, topic)
	}
}
