package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
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
	// Floor is the translation's floor (Translation.Floor): breakpoints
	// below it were dropped to bound memory. Older builds leave it out.
	Floor int64 `json:"floor,omitempty"`
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
	// kindActive marks a topic mirrored into this cluster now (the state
	// topic; partition -1): a group beside the source reads it to refuse
	// a mirror back that would close a loop (truncate.ActiveMirror).
	kindActive = "active"
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
//
// Its memory holds every partition's checkpoint but not the translation
// segments: only where each one's latest record sits in the topic
// (segments), so a member's heap does not grow with every partition ever
// mirrored into the destination (other members', deleted mirrors'). load
// reads a partition's segments from the topic when a member takes it.
type offsetStore struct {
	dest  *kafka.Cluster
	topic string
	// userTimeout is TCP_USER_TIMEOUT for the write connection (0: the
	// kernel's): bytes of a checkpoint write unacknowledged that long are
	// given up, not delivered after the lease (issue 19).
	userTimeout time.Duration

	// reading is held by the one catch-up that reads the topic (a
	// channel, so a caller's context bounds the wait): the read runs
	// without mu, which guards the maps below and is held only while a
	// batch read is folded in. A catch-up stuck on a stalled destination
	// (up to its exchange bound) thus holds up no checkpoint write, load
	// or metrics read, only the next catch-up, which gives up with its
	// caller's context (issue 22's CI: a handoff waited 50 s on such a
	// chain of locks).
	reading chan struct{}

	mu          sync.Mutex
	next        int64 // next offset to read; written only under reading and mu
	checkpoints map[Key]checkpoint
	segments    map[Key]map[int64]int64 // base -> offset of its latest record
	entries     map[Key]map[int64]int64 // legacy breakpoints: src -> dst
	stopped     map[Key][]byte          // last mirrored positions (the state topic)
	active      map[Key][]byte          // topics mirrored now (the state topic; partition -1)
	segCount    int                     // entries of segments, all keys
	stoppedSize int                     // bytes of stopped's values
	// gens is the highest lease generation stamped on any checkpoint or
	// segment record of each partition: a record of a lower one, written
	// by an owner that lost its lease without noticing (or delivered late
	// by the network), is ignored and counted in stale (issue 19).
	gens  map[Key]uint64
	stale map[Key]int
	// restamp holds the partitions whose latest record of some key is such
	// a stale one, with the lowest segment base among those (MaxInt64: the
	// checkpoint only). The offsets topic is compacted: once the cleaner
	// ran, only the latest record of a key is left, and the stale one
	// would be read as the partition's state. Its owner writes its own
	// again (Engine.restampStale).
	restamp map[Key]int64

	wmu   sync.Mutex
	wconn *kwire.Conn
	waddr string // the broker wconn is connected to
	// writeDeadline, when set (the engine's store), is the end of this
	// member's lease: checkpoints and translation segments are written
	// only before it, as produce requests are (issue 19: an owner that
	// lost its lease without noticing rolled the new owner's checkpoint
	// back).
	writeDeadline func() time.Time
}

func newOffsetStore(dest *kafka.Cluster, topic string, writeDeadline func() time.Time) *offsetStore {
	return &offsetStore{dest: dest, topic: topic, writeDeadline: writeDeadline, reading: make(chan struct{}, 1), checkpoints: map[Key]checkpoint{},
		segments: map[Key]map[int64]int64{}, entries: map[Key]map[int64]int64{}, stopped: map[Key][]byte{},
		active: map[Key][]byte{}, gens: map[Key]uint64{}, stale: map[Key]int{}, restamp: map[Key]int64{}}
}

// Bytes is the memory the store takes, roughly (kmirror_offsets_store_bytes):
// per partition a checkpoint, per translation segment an index entry, and
// the last mirrored positions read from the state topic.
func (s *offsetStore) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(len(s.checkpoints))*160 + int64(s.segCount)*48 + int64(s.stoppedSize) + int64(len(s.stopped))*96 + int64(len(s.gens))*48 + int64(len(s.stale))*48 + int64(len(s.restamp))*48
	for _, m := range s.entries {
		n += int64(len(m)) * 48
	}
	return n
}

// catchUp reads everything appended since the last call.
func (s *offsetStore) catchUp(ctx context.Context) error { return s.catchUpAged(ctx, 5*time.Second) }

// leaderConn returns a pooled connection to the topic's leader (metadata
// at most maxAge old) with its leader epoch; done gives it back, or closes
// it when the exchange broke.
func (s *offsetStore) leaderConn(ctx context.Context, maxAge time.Duration) (conn *kwire.Conn, epoch int32, done func(broken bool), err error) {
	_, addr, epoch, err := s.dest.Leader(ctx, s.topic, 0, maxAge)
	if err != nil {
		return nil, 0, nil, err
	}
	// A pooled connection: every resume catches up, and a member taking
	// over many partitions must not dial once per partition.
	conn, err = s.dest.Borrow(ctx, addr)
	if err != nil {
		return nil, 0, nil, err
	}
	return conn, epoch, func(broken bool) {
		if broken {
			conn.Close()
		} else {
			s.dest.GiveBack(addr, conn)
		}
	}, nil
}

// fetchAt reads the topic from offset from: the batches of one fetch
// response (at most maxBytes) and the high watermark.
func (s *offsetStore) fetchAt(ctx context.Context, conn *kwire.Conn, epoch int32, from int64, maxBytes int32) ([]kwire.Batch, int64, error) {
	fctx, cancel := kafka.ExchangeCtx(ctx)
	res, err := conn.Fetch(fctx, &kwire.FetchRequest{
		MaxBytes:   maxBytes,
		Partitions: []kwire.FetchPartition{{Topic: s.topic, Partition: 0, Offset: from, LeaderEpoch: epoch, MaxBytes: maxBytes}},
	})
	cancel()
	if err != nil {
		return nil, 0, err
	}
	if len(res) != 1 {
		return nil, 0, fmt.Errorf("read %s: malformed fetch response", s.topic)
	}
	fp := res[0]
	if fp.Err != 0 {
		return nil, 0, &kwire.Error{Code: fp.Err, Topic: s.topic, Op: "read checkpoints"}
	}
	batches, _, err := kwire.SplitBatches(fp.Records)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", s.topic, err)
	}
	return batches, fp.HighWatermark, nil
}

// catchUpAged is catchUp with the topic's leader taken from metadata at
// most maxAge old (0: asked afresh, after a leader change).
func (s *offsetStore) catchUpAged(ctx context.Context, maxAge time.Duration) error {
	select {
	case s.reading <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("read %s: waiting for another read of it: %w", s.topic, ctx.Err())
	}
	defer func() { <-s.reading }()
	conn, epoch, done, err := s.leaderConn(ctx, maxAge)
	if err != nil {
		return err
	}
	broken := true
	defer func() { done(broken) }()
	s.mu.Lock()
	next := s.next
	s.mu.Unlock()
	for {
		batches, hw, err := s.fetchAt(ctx, conn, epoch, next, 8<<20)
		if err != nil {
			return err
		}
		for _, b := range batches {
			if b.LastOffset() < next {
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return fmt.Errorf("read %s: %w", s.topic, err)
			}
			s.mu.Lock()
			for _, r := range recs {
				if r.Offset >= next {
					s.apply(r)
				}
			}
			next = b.LastOffset() + 1
			s.next = next
			s.mu.Unlock()
		}
		if next >= hw || len(batches) == 0 {
			if next < hw {
				return fmt.Errorf("read %s: no progress at offset %d below high watermark %d", s.topic, next, hw)
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
	if kind == kindCheckpoint || kind == kindSegment {
		if g := genOf(r); g != 0 {
			if g < s.gens[k] {
				s.stale[k]++
				s.noteRestampLocked(k, kind, extra)
				return
			}
			s.gens[k] = g
		}
	}
	switch kind {
	case kindActive:
		s.stoppedSize -= len(s.active[k])
		if r.Value == nil {
			delete(s.active, k)
			return
		}
		s.active[k] = append([]byte(nil), r.Value...)
		s.stoppedSize += len(r.Value)
	case kindStopped:
		s.stoppedSize -= len(s.stopped[k])
		if r.Value == nil {
			delete(s.stopped, k)
			return
		}
		s.stopped[k] = append([]byte(nil), r.Value...)
		s.stoppedSize += len(r.Value)
	case kindCheckpoint:
		if r.Value == nil {
			delete(s.checkpoints, k)
			s.pruneLocked(k)
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
			if _, ok := m[base]; ok {
				delete(m, base)
				s.segCount--
			}
			if len(m) == 0 {
				delete(s.segments, k)
				s.pruneLocked(k)
			}
			return
		}
		if m == nil {
			m = map[int64]int64{}
			s.segments[k] = m
		}
		if _, ok := m[base]; !ok {
			s.segCount++
		}
		m[base] = r.Offset
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
			if len(s.entries[k]) == 0 {
				delete(s.entries, k)
				s.pruneLocked(k)
			}
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

// noteRestampLocked records that the latest record of one of k's keys is a
// stale generation's (restamp).
func (s *offsetStore) noteRestampLocked(k Key, kind string, extra []string) {
	from, ok := s.restamp[k]
	if !ok {
		from = math.MaxInt64
	}
	if kind == kindSegment && len(extra) == 1 {
		if base, err := strconv.ParseInt(extra[0], 10, 64); err == nil {
			from = min(from, base)
		}
	}
	s.restamp[k] = from
}

// takeRestamps returns the partitions to write again (restamp) and
// forgets them.
func (s *offsetStore) takeRestamps() map[Key]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.restamp) == 0 {
		return nil
	}
	out := s.restamp
	s.restamp = map[Key]int64{}
	return out
}

// pruneLocked drops k's generation and stale count once nothing of k is
// left (forget tombstoned its checkpoint, segments and breakpoints), so
// the maps do not grow with every partition ever mirrored. A record
// written later under k is judged afresh: generations are raft indexes,
// so a re-added topic's are above any of its earlier life's.
func (s *offsetStore) pruneLocked(k Key) {
	if _, ok := s.checkpoints[k]; ok || len(s.segments[k]) > 0 || len(s.entries[k]) > 0 {
		return
	}
	delete(s.gens, k)
	delete(s.stale, k)
	delete(s.restamp, k)
}

// readSegments reads the segment records of partition k at the given
// topic offsets (offset -> base) and returns their values by base. It
// fetches from each offset still missing, so it reads about one fetch per
// stretch of the topic that holds k's segments, not the whole topic. A
// record no longer at its offset (compacted after a newer write of its
// key: catch up and read again) is errSegmentMoved.
func (s *offsetStore) readSegments(ctx context.Context, k Key, want map[int64]int64) (map[int64][]byte, error) {
	out := make(map[int64][]byte, len(want))
	if len(want) == 0 {
		return out, nil
	}
	offs := make([]int64, 0, len(want))
	for o := range want {
		offs = append(offs, o)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	conn, epoch, done, err := s.leaderConn(ctx, 5*time.Second)
	if err != nil {
		return nil, err
	}
	broken := true
	defer func() { done(broken) }()
	moved := func(o int64, why string) error {
		return fmt.Errorf("%w: %s segment at offset %d of %s %s", errSegmentMoved, k, o, s.topic, why)
	}
	for i := 0; i < len(offs); {
		batches, _, err := s.fetchAt(ctx, conn, epoch, offs[i], 1<<20)
		if err != nil {
			return nil, err
		}
		taken := i
		for _, b := range batches {
			if i == len(offs) {
				break
			}
			if b.LastOffset() < offs[i] {
				continue
			}
			recs, err := b.Records()
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", s.topic, err)
			}
			for _, r := range recs {
				if i == len(offs) || r.Offset < offs[i] {
					continue
				}
				if r.Offset > offs[i] {
					return nil, moved(offs[i], "is gone")
				}
				base := want[offs[i]]
				kind, rk, extra, ok := parseKey(r.Key)
				if !ok || kind != kindSegment || rk != k || len(extra) != 1 || extra[0] != strconv.FormatInt(base, 10) || r.Value == nil {
					return nil, moved(offs[i], "holds another record")
				}
				out[base] = append([]byte(nil), r.Value...)
				i++
			}
			if i < len(offs) && offs[i] <= b.LastOffset() {
				return nil, moved(offs[i], "is gone")
			}
		}
		if i == taken {
			return nil, moved(offs[i], "is past the end")
		}
	}
	broken = false
	return out, nil
}

// errSegmentMoved: a translation segment's record is not where the index
// said (a newer record of its key was written and compaction removed the
// older one); load catches up and reads again.
var errSegmentMoved = errors.New("translation segment record moved")

// load returns the checkpoint known for a partition and its translation
// restored at the checkpoint (start when there is none), its segments read
// from the topic. A segment that does not decode is an error: the
// translation would not be exact.
func (s *offsetStore) load(ctx context.Context, k Key, start Entry) (checkpoint, bool, Translation, error) {
	for try := 0; ; try++ {
		s.mu.Lock()
		cp, ok := s.checkpoints[k]
		want := make(map[int64]int64, len(s.segments[k]))
		for base, off := range s.segments[k] {
			want[off] = base
		}
		var legacy []Entry
		for src, dst := range s.entries[k] {
			legacy = append(legacy, Entry{Src: src, Dst: dst})
		}
		s.mu.Unlock()
		vals, err := s.readSegments(ctx, k, want)
		if errors.Is(err, errSegmentMoved) && try < 3 {
			if err := s.catchUp(ctx); err != nil {
				return cp, ok, Translation{}, err
			}
			continue
		}
		if err != nil {
			return cp, ok, Translation{}, fmt.Errorf("read the translation of %s: %w", k, err)
		}
		end := start
		if ok {
			end = Entry{Src: cp.Src, Dst: cp.Dst}
		}
		segs := make([]xlSeg, 0, len(vals))
		for base, v := range vals {
			seg, err := segmentFromValue(v)
			if err != nil || seg.base != base {
				return cp, ok, Translation{}, fmt.Errorf("translation segment %d of %s in %s: %v", base, k, s.topic, err)
			}
			segs = append(segs, seg)
		}
		sort.Slice(segs, func(i, j int) bool { return segs[i].base < segs[j].base })
		var xl Translation
		xl.restoreSegments(segs, legacy, end)
		if ok {
			xl.setFloor(cp.Floor)
		}
		return cp, ok, xl, nil
	}
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
		if err := s.append(ctx, s.topic, recs[:n], time.Time{}); err != nil {
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
