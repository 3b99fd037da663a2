package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go/protocol/deletetopics"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Record-level admin work: where a leader epoch ends, writing records as
// they are (truncation's quarantine copy, fetch.CopyRange), deleting a topic.

// EpochEnd asks a partition's leader where leaderEpoch ends
// (OffsetForLeaderEpoch, KIP-320): the end offset of the largest epoch at
// or below it, and that epoch; -1, -1 when the leader knows none.
func (a *Admin) EpochEnd(ctx context.Context, topic string, partition, leaderEpoch int32) (end int64, epoch int32, err error) {
	_, addr, current, err := a.cl.Leader(ctx, topic, partition, 0)
	if err != nil {
		return 0, 0, err
	}
	conn, err := a.cl.Borrow(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	rctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	ee, err := conn.EpochEndOffset(rctx, topic, partition, current, leaderEpoch)
	var kerr *kwire.Error
	if err != nil && !errors.As(err, &kerr) {
		conn.Close()
		return 0, 0, err
	}
	a.cl.GiveBack(addr, conn)
	if err != nil {
		return 0, 0, err
	}
	return ee.EndOffset, ee.LeaderEpoch, nil
}

// Produce writes records as one batch to topic/partition with acks=all
// (not idempotent: fetch.CopyRange runs once and is checked by the caller).
func (a *Admin) Produce(ctx context.Context, topic string, partition int32, recs []kwire.Record) error {
	b, err := kwire.EncodeBatch(recs, 0)
	if err != nil {
		return err
	}
	_, addr, _, err := a.cl.Leader(ctx, topic, partition, 0)
	if err != nil {
		return err
	}
	conn, err := a.cl.Borrow(ctx, addr)
	if err != nil {
		return err
	}
	rctx, cancel := ExchangeCtx(ctx)
	defer cancel()
	res, err := conn.Produce(rctx, -1, 30*time.Second, time.Time{}, []kwire.ProducePartition{{Topic: topic, Partition: partition, Batch: b}})
	if err != nil {
		conn.Close()
		return fmt.Errorf("write %s/%d on %s: %w", topic, partition, a.cl.Name, err)
	}
	a.cl.GiveBack(addr, conn)
	if len(res) != 1 || res[0].Err != 0 {
		code := int16(-1)
		if len(res) == 1 {
			code = res[0].Err
		}
		return &kwire.Error{Code: code, Topic: topic, Partition: partition, Op: "write to " + a.cl.Name}
	}
	return nil
}

// DeleteTopic deletes a topic and waits until metadata no longer lists it.
func (a *Admin) DeleteTopic(ctx context.Context, topic string) error {
	msg, err := a.cl.roundTrip(ctx, &deletetopics.Request{TopicNames: []string{topic}, TimeoutMs: 30000})
	if err != nil {
		return fmt.Errorf("delete topic %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, r := range msg.(*deletetopics.Response).Responses {
		if r.ErrorCode != 0 && r.ErrorCode != kwire.CodeUnknownTopicOrPartition {
			return &AdminError{Err: &kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "delete topic on " + a.cl.Name}}
		}
	}
	for {
		if _, err := a.Topic(ctx, topic); errors.Is(err, ErrTopicNotFound) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s on %s still listed after its deletion: %w", topic, a.cl.Name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
