package fetch

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Writing the offsets store: checkpoints and translation segments under the
// lease, last mirrored positions to the state topic.

// update is one partition's contribution to a checkpoint write: the
// translation segments changed since the last write, the segment bases
// trimmed, and the checkpoint.
type update struct {
	key Key
	// gen is the lease generation of the writer (0: none, a seed written
	// before any owner): every record carries it (genHeader).
	gen     uint64
	cp      checkpoint
	segs    []segRecord
	dropped []int64
}

// maxWriteBatchBytes bounds one record batch written to the offsets
// topic, well below the broker's default max.message.bytes (1 MiB), so a
// partition with many breakpoints never makes a write too large for the
// topic: its records are split across batches.
const maxWriteBatchBytes = 256 << 10

// write persists the updates: each partition's translation segments (and
// tombstones of trimmed ones), then its checkpoint, so a persisted
// checkpoint implies its breakpoints are persisted. Records go in batches of at most maxWriteBatchBytes, sent in
// order; one partition's records may span batches (its checkpoint in the
// last). A failed batch fails only the partitions with records in it: the
// others are written. It returns nil, or a *WriteError naming the failed
// partitions.
func (s *offsetStore) write(ctx context.Context, ups []update) error {
	return s.writeUnder(ctx, ups, s.writeDeadline)
}

// writeUnleased is write without the lease gate, for a starting checkpoint
// written before any owner holds the partition (Engine.Seed: failback and
// re-add, on the leader's add).
func (s *offsetStore) writeUnleased(ctx context.Context, ups []update) error {
	return s.writeUnder(ctx, ups, nil)
}

// writeUnder is write gated by deadline (nil: not gated).
func (s *offsetStore) writeUnder(ctx context.Context, ups []update, deadline func() time.Time) error {
	now := time.Now().UnixMilli()
	type pending struct {
		recs []kwire.Record
		size int
		keys map[Key]bool
	}
	var batches []*pending
	cur := &pending{keys: map[Key]bool{}}
	add := func(k Key, r kwire.Record) {
		n := len(r.Key) + len(r.Value) + 32
		if cur.size+n > maxWriteBatchBytes && len(cur.recs) > 0 {
			batches = append(batches, cur)
			cur = &pending{keys: map[Key]bool{}}
		}
		cur.recs = append(cur.recs, r)
		cur.size += n
		cur.keys[k] = true
	}
	for _, u := range ups {
		hs := genHeaders(u.gen)
		for _, sr := range u.segs {
			add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindSegment, u.key, strconv.FormatInt(sr.base, 10)), Value: sr.value, Headers: hs})
		}
		for _, base := range u.dropped {
			add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindSegment, u.key, strconv.FormatInt(base, 10)), Headers: hs})
		}
		if len(u.segs) > 0 {
			// Old-format breakpoints are in the segments now.
			for _, src := range s.legacyKeys(u.key) {
				add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindEntry, u.key, strconv.FormatInt(src, 10))})
			}
		}
		v, err := json.Marshal(u.cp)
		if err != nil {
			return err
		}
		add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindCheckpoint, u.key), Value: v, Headers: hs})
	}
	if len(cur.recs) > 0 {
		batches = append(batches, cur)
	}
	var writeBy time.Time
	if deadline != nil {
		writeBy = deadline()
		if !time.Now().Before(writeBy) {
			werr := &WriteError{Failed: map[Key]bool{}, Err: errNoLease}
			for _, u := range ups {
				werr.Failed[u.key] = true
			}
			return werr
		}
	}
	var werr *WriteError
	for _, b := range batches {
		if werr != nil && ctx.Err() != nil {
			for k := range b.keys {
				werr.Failed[k] = true
			}
			continue
		}
		if err := s.append(ctx, s.topic, b.recs, writeBy); err != nil {
			if werr == nil {
				werr = &WriteError{Failed: map[Key]bool{}, Err: err}
			}
			for k := range b.keys {
				werr.Failed[k] = true
			}
		}
	}
	if werr != nil {
		return werr
	}
	return nil
}

// WriteError is a checkpoint write that failed for some partitions.
type WriteError struct {
	Failed map[Key]bool
	Err    error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("checkpoint of %d partitions not written: %v", len(e.Failed), e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// errNoLease: a checkpoint write was not sent because this member's lease
// had ended; it is written in a later round, under the lease.
var errNoLease = errors.New("not written: this member's lease has ended (it writes again once the lease is back)")

// append produces records to partition 0 of topic with acks=all; with
// writeBy set, a request not wholly written by then fails with
// kwire.ErrNotSent (the lease, as for produce requests).
func (s *offsetStore) append(ctx context.Context, topic string, recs []kwire.Record, writeBy time.Time) error {
	b, err := kwire.EncodeBatch(recs, 0)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// A writer whose context ended while it waited (a handoff that gave
	// up on its drain) sends nothing: its caller has moved on.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write %s: %w", topic, err)
	}
	for attempt := 0; ; attempt++ {
		fresh, err := s.connectLocked(ctx, topic)
		if err != nil {
			return err
		}
		err = s.produceLocked(ctx, topic, b, writeBy)
		// A connection that a broker restart broke while it sat idle
		// fails before any byte reaches the broker: dialled again once
		// (issue 21: an add failed on "broken pipe" after an earlier
		// restart). Nothing was sent, so nothing can land twice.
		if err != nil && attempt == 0 && !fresh && errors.Is(err, kwire.ErrNotSent) && (writeBy.IsZero() || time.Now().Before(writeBy)) {
			continue
		}
		return err
	}
}

// connectLocked makes wconn a connection to the leader of topic's
// partition 0 (the offsets and the state topic may have different
// leaders; metadata at most 5 s old, a stale one answers NOT_LEADER and
// is asked afresh); fresh reports a new connection.
func (s *offsetStore) connectLocked(ctx context.Context, topic string) (fresh bool, err error) {
	_, addr, _, err := s.dest.Leader(ctx, topic, 0, 5*time.Second)
	if err != nil {
		return false, err
	}
	if s.wconn != nil && s.waddr != addr {
		s.wconn.Close()
		s.wconn = nil
	}
	if s.wconn != nil {
		return false, nil
	}
	if s.wconn, err = s.dest.Dial(ctx, addr); err != nil {
		return false, err
	}
	s.waddr = addr
	if s.userTimeout > 0 {
		if err := s.wconn.SetUserTimeout(s.userTimeout); err != nil {
			s.wconn.Close()
			s.wconn = nil
			return false, fmt.Errorf("write %s: %w", topic, err)
		}
	}
	return true, nil
}

// produceLocked sends batch b to partition 0 of topic on wconn with
// acks=all; a failure drops the connection.
func (s *offsetStore) produceLocked(ctx context.Context, topic string, b []byte, writeBy time.Time) error {
	if d := time.Until(s.wconn.ThrottledUntil()); d > 0 {
		// A quota on kmirror's client.id: the broker reads nothing on
		// this connection until the throttle ends (KIP-219).
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	res, err := s.wconn.Produce(ctx, -1, 30*time.Second, writeBy, []kwire.ProducePartition{{Topic: topic, Partition: 0, Batch: b}})
	if err == nil && (len(res) != 1 || res[0].Err != 0) {
		if len(res) == 1 {
			err = &kwire.Error{Code: res[0].Err, Topic: topic, Op: "write checkpoints"}
		} else {
			err = fmt.Errorf("write %s: malformed produce response", topic)
		}
	}
	if err != nil {
		s.wconn.Abort() // unsent bytes discarded, not delivered after the lease
		s.wconn = nil
		s.dest.Metadata(ctx, 0)
		return fmt.Errorf("write %s: %w", topic, err)
	}
	return nil
}

// writeStopped records a partition's last mirrored position in the state
// topic, readable with plain Kafka by the other side at failback. It is
// written only under this member's lease, as checkpoints and produce
// requests are, so an owner whose lease ended while its stop ran on
// cannot replace the position its successor recorded (issue 19). Unlike
// checkpoints it carries no generation for readers to compare: the state
// topic outlives the raft group whose log indexes the generations are (a
// group rebuilt from scratch starts over at low ones), and the last
// record of a key is what compaction keeps anyway.
func (s *offsetStore) writeStopped(ctx context.Context, topic string, k Key, rec any) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	var writeBy time.Time
	if s.writeDeadline != nil {
		if writeBy = s.writeDeadline(); !time.Now().Before(writeBy) {
			return fmt.Errorf("last mirrored position of %s %w", k, errNoLease)
		}
	}
	now := time.Now().UnixMilli()
	// In the same batch, the topic's active record goes: once one of its
	// partitions has stopped, the topic is on its way to being the
	// writable copy, and a mirror back (failback) must not be refused as
	// a loop.
	return s.append(ctx, topic, []kwire.Record{
		{Timestamp: now, Key: recordKey(kindStopped, k), Value: v},
		{Timestamp: now, Key: activeKey(k.Mirror, k.Topic)},
	}, writeBy)
}

// activeKey is the state topic key of a topic's active record.
func activeKey(mirror, topic string) []byte {
	return recordKey(kindActive, Key{Mirror: mirror, Topic: topic, Partition: -1})
}

// writeActive writes (value nil: deletes) a topic's active record in the
// state topic; not gated by a lease (the raft leader writes it).
func (s *offsetStore) writeActive(ctx context.Context, topic, mirror, mirrored string, value []byte) error {
	return s.append(ctx, topic, []kwire.Record{{Timestamp: time.Now().UnixMilli(), Key: activeKey(mirror, mirrored), Value: value}}, time.Time{})
}

func (s *offsetStore) close() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wconn != nil {
		s.wconn.Close()
		s.wconn = nil
	}
}

// genHeader names the record header that stamps a checkpoint or
// translation segment record with its writer's lease generation (8 bytes,
// big endian; issue 19). Older builds write none and ignore it.
const genHeader = "kmirror.generation"

func genHeaders(gen uint64) []kwire.Header {
	if gen == 0 {
		return nil
	}
	return []kwire.Header{{Key: genHeader, Value: binary.BigEndian.AppendUint64(nil, gen)}}
}

// genOf is the generation a record is stamped with (0: none).
func genOf(r kwire.Record) uint64 {
	for _, h := range r.Headers {
		if h.Key == genHeader && len(h.Value) == 8 {
			return binary.BigEndian.Uint64(h.Value)
		}
	}
	return 0
}

// GenerationHeader is the record header that stamps each checkpoint and
// translation segment of the offsets topic with its writer's lease
// generation (8 bytes, big-endian; issue 19).
const GenerationHeader = genHeader

// CheckpointRecord is a partition's checkpoint as one record of the offsets
// topic holds it: the source offset mirrored up to, the destination offset
// it maps to, and the lease generation it was written under (0: a build
// before the stamp).
type CheckpointRecord struct {
	Key               Key
	SourceOffset      int64
	DestinationOffset int64
	Generation        uint64
}

// DecodeCheckpoint decodes a record of the offsets topic from its key,
// value and GenerationHeader value (nil: none); ok is false for a record
// of another kind (translation, last mirrored position), a tombstone, or
// one that does not parse. For tools and tests that read the topic.
func DecodeCheckpoint(key, value, generation []byte) (CheckpointRecord, bool) {
	kind, k, _, ok := parseKey(key)
	if !ok || kind != kindCheckpoint || value == nil {
		return CheckpointRecord{}, false
	}
	var cp checkpoint
	if json.Unmarshal(value, &cp) != nil {
		return CheckpointRecord{}, false
	}
	rec := CheckpointRecord{Key: k, SourceOffset: cp.Src, DestinationOffset: cp.Dst}
	if len(generation) == 8 {
		rec.Generation = binary.BigEndian.Uint64(generation)
	}
	return rec, true
}
