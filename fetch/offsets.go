package fetch

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// checkpoint is a partition's persisted progress: everything below Src is
// mirrored (or skipped) into the destination below Dst, and the next batch
// carries sequence Seq of producer PID.
type checkpoint struct {
	Src         int64 `json:"src"`
	Dst         int64 `json:"dst"`
	Seq         int32 `json:"seq"`
	PID         int64 `json:"pid"`
	Epoch       int16 `json:"epoch"`
	LeaderEpoch int32 `json:"le"`
}

// Record keys of the offsets topic (compacted; the latest value per key
// wins). Topic and mirror names cannot hold a NUL byte.
const (
	kindCheckpoint = "ckpt"
	// kindEntry is one breakpoint per record (builds before segments):
	// still read, deleted once its partition's segments are written.
	kindEntry   = "xlat"
	kindSegment = "xseg" // a segment of breakpoints (translate.go)
	kindStopped = "stopped"
)

func recordKey(kind string, k Key, extra ...string) []byte {
	parts := append([]string{kind, k.Mirror, k.Topic, strconv.Itoa(int(k.Partition))}, extra...)
	return []byte(strings.Join(parts, "\x00"))
}

func parseKey(b []byte) (kind string, k Key, extra []string, ok bool) {
	parts := strings.Split(string(b), "\x00")
	if len(parts) < 4 {
		return "", Key{}, nil, false
	}
	p, err := strconv.Atoi(parts[3])
	if err != nil {
		return "", Key{}, nil, false
	}
	return parts[0], Key{Mirror: parts[1], Topic: parts[2], Partition: int32(p)}, parts[4:], true
}

// offsetStore keeps checkpoints and translation breakpoints in a
// single-partition compacted topic on the destination cluster. It reads the
// topic up to its high watermark on demand (catchUp) and appends with
// acks=all.
type offsetStore struct {
	dest  *kafka.Cluster
	topic string

	mu          sync.Mutex
	next        int64 // next offset to read
	checkpoints map[Key]checkpoint
	segments    map[Key]map[int64][]byte // base -> segment record value
	entries     map[Key]map[int64]int64  // legacy breakpoints: src -> dst
	stopped     map[Key][]byte           // last mirrored positions (the state topic)

	wmu   sync.Mutex
	wconn *kwire.Conn
}

func newOffsetStore(dest *kafka.Cluster, topic string) *offsetStore {
	return &offsetStore{dest: dest, topic: topic, checkpoints: map[Key]checkpoint{},
		segments: map[Key]map[int64][]byte{}, entries: map[Key]map[int64]int64{}, stopped: map[Key][]byte{}}
}

// catchUp reads everything appended since the last call.
func (s *offsetStore) catchUp(ctx context.Context) error { return s.catchUpAged(ctx, 5*time.Second) }

// catchUpAged is catchUp with the topic's leader taken from metadata at
// most maxAge old (0: asked afresh, after a leader change).
func (s *offsetStore) catchUpAged(ctx context.Context, maxAge time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, addr, epoch, err := s.dest.Leader(ctx, s.topic, 0, maxAge)
	if err != nil {
		return err
	}
	// A pooled connection: every resume catches up, and a member taking
	// over many partitions must not dial once per partition.
	conn, err := s.dest.Borrow(ctx, addr)
	if err != nil {
		return err
	}
	broken := true
	defer func() {
		if broken {
			conn.Close()
		} else {
			s.dest.GiveBack(addr, conn)
		}
	}()
	for {
		fctx, cancel := kafka.ExchangeCtx(ctx)
		res, err := conn.Fetch(fctx, &kwire.FetchRequest{
			MaxBytes: 8 << 20,
			Partitions: []kwire.FetchPartition{{Topic: s.topic, Partition: 0, Offset: s.next,
				LeaderEpoch: epoch, MaxBytes: 8 << 20}},
		})
		cancel()
		if err != nil {
			return err
		}
		if len(res) != 1 {
			return fmt.Errorf("read %s: malformed fetch response", s.topic)
		}
		fp := res[0]
		if fp.Err != 0 {
			return &kwire.Error{Code: fp.Err, Topic: s.topic, Op: "read checkpoints"}
		}
		batches, _, err := kwire.SplitBatches(fp.Records)
		if err != nil {
			return fmt.Errorf("read %s: %w", s.topic, err)
		}
		for _, b := range batches {
			if b.LastOffset() < s.next {
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return fmt.Errorf("read %s: %w", s.topic, err)
			}
			for _, r := range recs {
				if r.Offset >= s.next {
					s.apply(r)
				}
			}
			s.next = b.LastOffset() + 1
		}
		if s.next >= fp.HighWatermark || len(batches) == 0 {
			if s.next < fp.HighWatermark {
				return fmt.Errorf("read %s: no progress at offset %d below high watermark %d", s.topic, s.next, fp.HighWatermark)
			}
			broken = false
			return nil
		}
	}
}

// apply folds one record of the topic into memory. Records this version
// does not know are ignored, so a newer kmirror can add kinds.
func (s *offsetStore) apply(r kwire.Record) {
	kind, k, extra, ok := parseKey(r.Key)
	if !ok {
		return
	}
	switch kind {
	case kindStopped:
		if r.Value == nil {
			delete(s.stopped, k)
			return
		}
		s.stopped[k] = append([]byte(nil), r.Value...)
	case kindCheckpoint:
		if r.Value == nil {
			delete(s.checkpoints, k)
			return
		}
		var cp checkpoint
		if json.Unmarshal(r.Value, &cp) == nil {
			s.checkpoints[k] = cp
		}
	case kindSegment:
		if len(extra) != 1 {
			return
		}
		base, err := strconv.ParseInt(extra[0], 10, 64)
		if err != nil {
			return
		}
		m := s.segments[k]
		if r.Value == nil {
			delete(m, base)
			if len(m) == 0 {
				delete(s.segments, k)
			}
			return
		}
		if m == nil {
			m = map[int64][]byte{}
			s.segments[k] = m
		}
		m[base] = append([]byte(nil), r.Value...)
	case kindEntry:
		if len(extra) != 1 {
			return
		}
		src, err1 := strconv.ParseInt(extra[0], 10, 64)
		if err1 != nil {
			return
		}
		if r.Value == nil {
			delete(s.entries[k], src)
			return
		}
		dst, err2 := strconv.ParseInt(string(r.Value), 10, 64)
		if err2 != nil {
			return
		}
		m := s.entries[k]
		if m == nil {
			m = map[int64]int64{}
			s.entries[k] = m
		}
		m[src] = dst
	}
}

// load returns the checkpoint known for a partition and its translation
// restored at the checkpoint (start when there is none). A segment that
// does not decode is an error: the translation would not be exact.
func (s *offsetStore) load(k Key, start Entry) (checkpoint, bool, Translation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, ok := s.checkpoints[k]
	end := start
	if ok {
		end = Entry{Src: cp.Src, Dst: cp.Dst}
	}
	var segs []xlSeg
	for base, v := range s.segments[k] {
		seg, err := segmentFromValue(v)
		if err != nil || seg.base != base {
			return cp, ok, Translation{}, fmt.Errorf("translation segment %d of %s in %s: %v", base, k, s.topic, err)
		}
		segs = append(segs, seg)
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].base < segs[j].base })
	var legacy []Entry
	for src, dst := range s.entries[k] {
		legacy = append(legacy, Entry{Src: src, Dst: dst})
	}
	var xl Translation
	xl.restoreSegments(segs, legacy, end)
	return cp, ok, xl, nil
}

// segmentBases returns the bases of the translation segments kept for k.
func (s *offsetStore) segmentBases(k Key) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, 0, len(s.segments[k]))
	for base := range s.segments[k] {
		out = append(out, base)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// forget writes tombstones for every record of a mirror's topic: its
// partitions' checkpoints, segments and old-format breakpoints.
func (s *offsetStore) forget(ctx context.Context, mirror, topic string) error {
	now := time.Now().UnixMilli()
	var recs []kwire.Record
	s.mu.Lock()
	keys := map[Key]bool{}
	for k := range s.checkpoints {
		keys[k] = true
	}
	for k := range s.segments {
		keys[k] = true
	}
	for k := range s.entries {
		keys[k] = true
	}
	for k := range keys {
		if k.Mirror != mirror || k.Topic != topic {
			continue
		}
		recs = append(recs, kwire.Record{Timestamp: now, Key: recordKey(kindCheckpoint, k)})
		for base := range s.segments[k] {
			recs = append(recs, kwire.Record{Timestamp: now, Key: recordKey(kindSegment, k, strconv.FormatInt(base, 10))})
		}
		for src := range s.entries[k] {
			recs = append(recs, kwire.Record{Timestamp: now, Key: recordKey(kindEntry, k, strconv.FormatInt(src, 10))})
		}
	}
	s.mu.Unlock()
	for len(recs) > 0 {
		n := min(len(recs), 2000)
		if err := s.append(ctx, s.topic, recs[:n]); err != nil {
			return err
		}
		recs = recs[n:]
	}
	return s.catchUp(ctx)
}

// checkpointOf returns the checkpoint known for a partition.
func (s *offsetStore) checkpointOf(k Key) (checkpoint, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, ok := s.checkpoints[k]
	return cp, ok
}

// legacyKeys lists the old-format breakpoints of a partition, to delete
// once its segments are written.
func (s *offsetStore) legacyKeys(k Key) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int64, 0, len(s.entries[k]))
	for src := range s.entries[k] {
		out = append(out, src)
	}
	return out
}

// update is one partition's contribution to a checkpoint write: the
// translation segments changed since the last write, the segment bases
// trimmed, and the checkpoint.
type update struct {
	key     Key
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
		for _, sr := range u.segs {
			add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindSegment, u.key, strconv.FormatInt(sr.base, 10)), Value: sr.value})
		}
		for _, base := range u.dropped {
			add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindSegment, u.key, strconv.FormatInt(base, 10))})
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
		add(u.key, kwire.Record{Timestamp: now, Key: recordKey(kindCheckpoint, u.key), Value: v})
	}
	if len(cur.recs) > 0 {
		batches = append(batches, cur)
	}
	var werr *WriteError
	for _, b := range batches {
		if werr != nil && ctx.Err() != nil {
			for k := range b.keys {
				werr.Failed[k] = true
			}
			continue
		}
		if err := s.append(ctx, s.topic, b.recs); err != nil {
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

// append produces records to partition 0 of topic with acks=all.
func (s *offsetStore) append(ctx context.Context, topic string, recs []kwire.Record) error {
	b, err := kwire.EncodeBatch(recs, 0)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wconn == nil {
		_, addr, _, err := s.dest.Leader(ctx, topic, 0, 5*time.Second)
		if err != nil {
			return err
		}
		if s.wconn, err = s.dest.Dial(ctx, addr); err != nil {
			return err
		}
	}
	if d := time.Until(s.wconn.ThrottledUntil()); d > 0 {
		// A quota on kmirror's client.id: the broker reads nothing on
		// this connection until the throttle ends (KIP-219).
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	res, err := s.wconn.Produce(ctx, -1, 30*time.Second, time.Time{}, []kwire.ProducePartition{{Topic: topic, Partition: 0, Batch: b}})
	if err == nil && (len(res) != 1 || res[0].Err != 0) {
		if len(res) == 1 {
			err = &kwire.Error{Code: res[0].Err, Topic: topic, Op: "write checkpoints"}
		} else {
			err = fmt.Errorf("write %s: malformed produce response", topic)
		}
	}
	if err != nil {
		s.wconn.Close()
		s.wconn = nil
		s.dest.Metadata(ctx, 0)
		return fmt.Errorf("write %s: %w", topic, err)
	}
	return nil
}

// writeStopped records a partition's last mirrored position in the state
// topic, readable with plain Kafka by the other side at failback.
func (s *offsetStore) writeStopped(ctx context.Context, topic string, k Key, rec any) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.append(ctx, topic, []kwire.Record{{Timestamp: time.Now().UnixMilli(), Key: recordKey(kindStopped, k), Value: v}})
}

func (s *offsetStore) close() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.wconn != nil {
		s.wconn.Close()
		s.wconn = nil
	}
}
