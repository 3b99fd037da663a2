package fetch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go/protocol/deletetopics"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// Reading another kmirror group's records: a group beside the old source
// reads the new source's state topic (last mirrored positions) and offsets
// topic (translation) to mirror a topic back (design.md section 8).

// StoppedRecords returns the values of every stopped partition's record in
// the cluster's state topic (the topic is kmirror's __kmirror_state), by
// partition key; none when the topic does not exist.
func (a *Admin) StoppedRecords(ctx context.Context, topic string) (map[Key][]byte, error) {
	s := newOffsetStore(a.cl, topic)
	if err := s.catchUp(ctx); err != nil {
		var kerr *kwire.Error
		if errors.Is(err, ErrTopicNotFound) || (errors.As(err, &kerr) && kerr.Code == kwire.CodeUnknownTopicOrPartition) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s on %s: %w", topic, a.cl.name, err)
	}
	return s.stopped, nil
}

// TranslationOf returns the translation breakpoints of partition k kept in
// the cluster's offsets topic (the topic is kmirror's __kmirror_offsets),
// with the checkpoint they end at; ok is false when there is no
// checkpoint.
func (a *Admin) TranslationOf(ctx context.Context, topic string, k Key) (entries []Entry, end Entry, ok bool, err error) {
	s := newOffsetStore(a.cl, topic)
	if err := s.catchUp(ctx); err != nil {
		return nil, Entry{}, false, fmt.Errorf("read %s on %s: %w", topic, a.cl.name, err)
	}
	cp, ok, xl, err := s.load(k, Entry{})
	if err != nil || !ok {
		return nil, Entry{}, false, err
	}
	return xl.Entries(), Entry{Src: cp.Src, Dst: cp.Dst}, true, nil
}

// Seed writes a starting checkpoint for a partition that has never run
// under this key: mirroring starts at source offset at.Src into
// destination offset at.Dst, with a fresh producer identity (the resume
// walk verifies the destination from there), and entries as its
// translation below that point; leaderEpoch is the source leader epoch
// of the last batch before it (-1 unknown), from which a later source
// leader change is checked for truncation. Failback and the re-add of a stopped
// topic seed their partitions this way, so the existing records are not
// copied again. Earlier records of the key are replaced.
func (e *Engine) Seed(ctx context.Context, k Key, at Entry, leaderEpoch int32, entries []Entry) error {
	e.ckptMu.Lock()
	defer e.ckptMu.Unlock()
	if err := e.store.catchUp(ctx); err != nil {
		return fmt.Errorf("read checkpoints: %w", err)
	}
	var xl Translation
	xl.Restore(nil, Entry{})
	for _, en := range entries {
		if en.Src < at.Src {
			xl.Observe(en.Src, en.Dst)
		}
	}
	xl.Advance(at.Src, at.Dst)
	segs, _ := xl.takeUnsaved()
	keep := map[int64]bool{}
	for _, sr := range segs {
		keep[sr.base] = true
	}
	var dropped []int64
	for _, base := range e.store.segmentBases(k) {
		if !keep[base] {
			dropped = append(dropped, base)
		}
	}
	up := update{key: k, segs: segs, dropped: dropped, cp: checkpoint{Src: at.Src, Dst: at.Dst, PID: -1, LeaderEpoch: leaderEpoch}}
	err := e.store.write(ctx, []update{up})
	if err != nil && ctx.Err() == nil {
		// The write connection may have been broken by a broker
		// restart: it is dialled again for the second attempt.
		err = e.store.write(ctx, []update{up})
	}
	if err != nil {
		return fmt.Errorf("seed checkpoint of %s: %w", k, err)
	}
	return nil
}

// EpochEnd asks a partition's leader where leaderEpoch ends
// (OffsetForLeaderEpoch, KIP-320): the end offset of the largest epoch at
// or below it, and that epoch; -1, -1 when the leader knows none.
func (a *Admin) EpochEnd(ctx context.Context, topic string, partition, leaderEpoch int32) (end int64, epoch int32, err error) {
	_, addr, current, err := a.cl.leader(ctx, topic, partition, 0)
	if err != nil {
		return 0, 0, err
	}
	conn, err := a.cl.borrow(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	rctx, cancel := exchangeCtx(ctx)
	defer cancel()
	ee, err := conn.EpochEndOffset(rctx, topic, partition, current, leaderEpoch)
	var kerr *kwire.Error
	if err != nil && !errors.As(err, &kerr) {
		conn.Close()
		return 0, 0, err
	}
	a.cl.giveBack(addr, conn)
	if err != nil {
		return 0, 0, err
	}
	return ee.EndOffset, ee.LeaderEpoch, nil
}

// CopyRange copies the committed records of topic/partition at offsets
// [from, to) of this cluster into dstTopic/partition of the same cluster,
// as a read_committed consumer sees them (aborted transactions and
// control records left out), keeping key, value, headers and timestamp.
// It is the quarantine copy of truncation: the caller deletes the
// originals only after it returned nil. It returns the records copied.
func (a *Admin) CopyRange(ctx context.Context, topic string, partition int32, from, to int64, dstTopic string) (int64, error) {
	r, err := openPartitionReader(ctx, a.cl, topic, partition, from, true)
	if err != nil {
		return 0, err
	}
	defer r.close()
	var copied int64
	for r.offset < to {
		fp, err := r.fetch(ctx)
		if err != nil {
			return copied, err
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, r.offset)
		if err != nil {
			return copied, err
		}
		for _, it := range items {
			if it.skip() {
				continue
			}
			recs, err := it.records()
			if err != nil {
				return copied, err
			}
			kept := recs[:0]
			for _, rec := range recs {
				if rec.Offset < to {
					kept = append(kept, rec)
				}
			}
			if len(kept) == 0 {
				continue
			}
			if err := a.produce(ctx, dstTopic, partition, kept); err != nil {
				return copied, err
			}
			copied += int64(len(kept))
		}
		switch {
		case need > 0:
			r.maxBytes = int32(max(int(r.maxBytes)*2, need))
		case next == r.offset && fp.LastStableOffset <= r.offset:
			// Nothing committed past here yet (an open transaction).
			return copied, fmt.Errorf("copy %s/%d: offsets %d..%d are not committed yet", topic, partition, r.offset, to-1)
		}
		r.offset = next
	}
	return copied, nil
}

// produce writes records as one batch to topic/partition with acks=all
// (not idempotent: CopyRange runs once and is checked by the caller).
func (a *Admin) produce(ctx context.Context, topic string, partition int32, recs []kwire.Record) error {
	b, err := kwire.EncodeBatch(recs, 0)
	if err != nil {
		return err
	}
	_, addr, _, err := a.cl.leader(ctx, topic, partition, 0)
	if err != nil {
		return err
	}
	conn, err := a.cl.borrow(ctx, addr)
	if err != nil {
		return err
	}
	rctx, cancel := exchangeCtx(ctx)
	defer cancel()
	res, err := conn.Produce(rctx, -1, 30*time.Second, time.Time{}, []kwire.ProducePartition{{Topic: topic, Partition: partition, Batch: b}})
	if err != nil {
		conn.Close()
		return fmt.Errorf("write %s/%d on %s: %w", topic, partition, a.cl.name, err)
	}
	a.cl.giveBack(addr, conn)
	if len(res) != 1 || res[0].Err != 0 {
		code := int16(-1)
		if len(res) == 1 {
			code = res[0].Err
		}
		return &kwire.Error{Code: code, Topic: topic, Partition: partition, Op: "write to " + a.cl.name}
	}
	return nil
}

// DeleteTopic deletes a topic and waits until metadata no longer lists it.
func (a *Admin) DeleteTopic(ctx context.Context, topic string) error {
	msg, err := a.cl.roundTrip(ctx, &deletetopics.Request{TopicNames: []string{topic}, TimeoutMs: 30000})
	if err != nil {
		return fmt.Errorf("delete topic %s on %s: %w", topic, a.cl.name, err)
	}
	for _, r := range msg.(*deletetopics.Response).Responses {
		if r.ErrorCode != 0 && r.ErrorCode != kwire.CodeUnknownTopicOrPartition {
			return &AdminError{Err: &kwire.Error{Code: r.ErrorCode, Topic: topic, Partition: -1, Op: "delete topic on " + a.cl.name}}
		}
	}
	for {
		if _, err := a.Topic(ctx, topic); errors.Is(err, ErrTopicNotFound) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s on %s still listed after its deletion: %w", topic, a.cl.name, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
