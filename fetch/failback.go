package fetch

import (
	"context"
	"errors"
	"fmt"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Reading another kmirror group's records: a group beside the old source
// reads the new source's state topic (last mirrored positions) and offsets
// topic (translation) to mirror a topic back (design.md section 8).

// StoppedRecords returns the values of every stopped partition's record in
// the cluster's state topic (the topic is kmirror's __kmirror_state), by
// partition key; none when the topic does not exist.
func StoppedRecords(ctx context.Context, a *kafka.Admin, topic string) (map[Key][]byte, error) {
	s, err := readStateTopic(ctx, a, topic)
	if s == nil {
		return nil, err
	}
	return s.stopped, nil
}

// readStateTopic reads the cluster's state topic; nil without an error
// when the topic does not exist.
func readStateTopic(ctx context.Context, a *kafka.Admin, topic string) (*offsetStore, error) {
	s := newOffsetStore(a.Cluster(), topic, nil)
	if err := s.catchUp(ctx); err != nil {
		var kerr *kwire.Error
		if errors.Is(err, kafka.ErrTopicNotFound) || (errors.As(err, &kerr) && kerr.Code == kwire.CodeUnknownTopicOrPartition) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s on %s: %w", topic, a.Cluster().Name, err)
	}
	return s, nil
}

// ActiveRecords returns the values of every active record in the
// cluster's state topic (a topic mirrored into that cluster now, written
// by the group beside it), keyed by mirror and topic (partition -1); none
// when the topic does not exist.
func ActiveRecords(ctx context.Context, a *kafka.Admin, topic string) (map[Key][]byte, error) {
	s, err := readStateTopic(ctx, a, topic)
	if s == nil {
		return nil, err
	}
	return s.active, nil
}

// RecordActive writes value (JSON; nil deletes it) as the active record of
// mirror's topic in the destination's state topic: the topic is mirrored
// into this cluster now. A partition's stop deletes it (RecordStopped).
func (e *Engine) RecordActive(ctx context.Context, mirror, topic string, value []byte) error {
	return e.store.writeActive(ctx, e.cfg.StateTopic, mirror, topic, value)
}

// TranslationOf returns the translation breakpoints of partition k kept in
// the cluster's offsets topic (the topic is kmirror's __kmirror_offsets),
// with the checkpoint they end at; ok is false when there is no
// checkpoint.
func TranslationOf(ctx context.Context, a *kafka.Admin, topic string, k Key) (entries []Entry, end Entry, ok bool, err error) {
	s := newOffsetStore(a.Cluster(), topic, nil)
	if err := s.catchUp(ctx); err != nil {
		return nil, Entry{}, false, fmt.Errorf("read %s on %s: %w", topic, a.Cluster().Name, err)
	}
	cp, ok, xl, err := s.load(ctx, k, Entry{})
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
	err := e.store.writeUnleased(ctx, []update{up})
	if err != nil && ctx.Err() == nil {
		// The write connection may have been broken by a broker
		// restart: it is dialled again for the second attempt.
		err = e.store.writeUnleased(ctx, []update{up})
	}
	if err != nil {
		return fmt.Errorf("seed checkpoint of %s: %w", k, err)
	}
	return nil
}

// CopyRange copies the committed records of topic/partition at offsets
// [from, to) of this cluster into dstTopic/partition of the same cluster,
// as a read_committed consumer sees them (aborted transactions and
// control records left out), keeping key, value, headers and timestamp.
// It is the quarantine copy of truncation: the caller deletes the
// originals only after it returned nil. It returns the records copied.
func CopyRange(ctx context.Context, a *kafka.Admin, topic string, partition int32, from, to int64, dstTopic string) (int64, error) {
	var copied int64
	err := eachCommitted(ctx, a, topic, partition, from, to, func(recs []kwire.Record) error {
		if err := a.Produce(ctx, dstTopic, partition, recs); err != nil {
			return err
		}
		copied += int64(len(recs))
		return nil
	})
	return copied, err
}

// errStopRead ends eachCommitted early without an error.
var errStopRead = errors.New("stop reading")

// eachCommitted calls fn with the records of each batch of
// topic/partition at offsets [from, to) as a read_committed consumer sees
// them (aborted transactions and control records left out); to < 0 reads
// up to the last stable offset. fn returning errStopRead ends it with nil.
// Offsets not yet committed below to are an error.
func eachCommitted(ctx context.Context, a *kafka.Admin, topic string, partition int32, from, to int64, fn func([]kwire.Record) error) error {
	r, err := kafka.OpenPartitionReader(ctx, a.Cluster(), topic, partition, from, true)
	if err != nil {
		return err
	}
	defer r.Close()
	for to < 0 || r.Offset < to {
		fp, err := r.Fetch(ctx)
		if err != nil {
			return err
		}
		items, next, need, err := buildItems(fp.Records, fp.Aborted, r.Offset)
		if err != nil {
			return err
		}
		for _, it := range items {
			if it.skip() {
				continue
			}
			recs, err := it.records()
			if err != nil {
				return err
			}
			kept := recs[:0]
			for _, rec := range recs {
				if rec.Offset >= r.Offset && (to < 0 || rec.Offset < to) {
					kept = append(kept, rec)
				}
			}
			if len(kept) == 0 {
				continue
			}
			if err := fn(kept); err != nil {
				if errors.Is(err, errStopRead) {
					return nil
				}
				return err
			}
		}
		switch {
		case need > 0:
			r.MaxBytes = int32(max(int(r.MaxBytes)*2, need))
		case next == r.Offset && fp.LastStableOffset <= r.Offset:
			if to < 0 {
				return nil
			}
			// Nothing committed past here yet (an open transaction).
			return fmt.Errorf("%s/%d: offsets %d..%d are not committed yet", topic, partition, r.Offset, to-1)
		}
		r.Offset = next
	}
	return nil
}
