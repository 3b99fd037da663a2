package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
	"go.uber.org/zap"
)

// The leader finishes PENDING topics: an add that was accepted before its
// destination topic existed (or its configs could be set) is completed
// here, on every leader round until it is.

// FinishPending completes a topic left PENDING by a leader that stopped
// between recording it and creating the destination topic, or whose
// creation failed: it creates the destination topic with the recorded
// configs and replication factor (or adopts the one an earlier attempt
// created, if its partition count matches). A failure keeps the topic
// PENDING with the reason shown, retried every pendingRetry.
func (o *Ops) FinishPending(lctx context.Context, t raftstore.MirrorTopic) {
	key := raftstore.TopicKey(t.Mirror, t.Topic)
	o.creatingMu.Lock()
	if o.pendingTried == nil {
		o.pendingTried = map[string]time.Time{}
	}
	busy := o.creating[key]
	if !busy && time.Since(o.pendingTried[key]) < pendingRetry {
		busy = true
	}
	if !busy {
		o.pendingTried[key] = time.Now()
	}
	o.creatingMu.Unlock()
	if busy {
		return
	}
	ctx, cancel := context.WithTimeout(lctx, adminTimeout)
	defer cancel()
	tm, err := o.dest.Topic(ctx, t.Topic)
	destID := tm.ID
	switch {
	case errors.Is(err, kafka.ErrTopicNotFound):
		destID, err = o.createDestination(ctx, t)
	case err == nil && tm.Partitions != len(t.Partitions):
		err = fmt.Errorf("destination topic %s has %d partitions, the source %d: delete it on the destination cluster, "+
			"kmirror creates it again", t.Topic, tm.Partitions, len(t.Partitions))
	}
	if err != nil {
		reason := "creating the destination topic failed (retried every " + pendingRetry.String() + "): " + err.Error()
		if t.Reason != reason {
			if aerr := o.store.Apply(ctx, raftstore.SetTopicState{Mirror: t.Mirror, Topic: t.Topic, State: raftstore.StatePending, Reason: reason}); aerr != nil {
				o.log.Warn("record pending topic's reason", zap.String("topic", t.Topic), zap.Error(aerr))
			}
		}
		o.log.Warn("create destination topic of a pending topic", zap.String("mirror", t.Mirror), zap.String("topic", t.Topic), zap.Error(err))
		return
	}
	if aerr := o.store.Apply(ctx, raftstore.SetTopicState{Mirror: t.Mirror, Topic: t.Topic, State: raftstore.StateMirroring, DestTopicID: destID}); aerr != nil {
		o.log.Warn("finish pending topic", zap.String("topic", t.Topic), zap.Error(aerr))
	}
}
