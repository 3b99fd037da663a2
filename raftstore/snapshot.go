package raftstore

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/hashicorp/raft"
)

// snapshotFormat is the first field of every snapshot. Bump it when the
// layout or a record's meaning changes, and keep reading the old ones.
// Format 1: the records as they are; format 2: the same records
// gzip-compressed (100,000 partitions take ~1.5 MB instead of ~13 MB).
const snapshotFormat uint16 = 2

// recordType is the first byte of a snapshot record. Stored on disk: never
// renumber or reuse.
type recordType uint8

const (
	recordMirror recordType = 1
	recordTopic  recordType = 2
	recordMember recordType = 3
	recordEnd    recordType = 0xFF
)

// maxRecordSize bounds the allocation for one record so a corrupt length
// fails cleanly instead of exhausting memory.
const maxRecordSize = 64 << 20

type fsmSnapshot struct {
	state *State
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if err := writeSnapshot(sink, s.state); err != nil {
		return errors.Join(err, sink.Cancel())
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() {}

// writeSnapshot writes the header {format uint16, index uint64}, then,
// gzip-compressed, one record per mirror, topic and member (type byte,
// uint32 length, JSON), each kind in key order, then the end marker.
// Integers are big-endian.
func writeSnapshot(w io.Writer, s *State) error {
	return writeSnapshotFormat(w, s, snapshotFormat)
}

// writeSnapshotFormat writes format 1 (plain records) or 2 (gzip).
func writeSnapshotFormat(w io.Writer, s *State, format uint16) error {
	out := bufio.NewWriter(w)
	var hdr [10]byte
	binary.BigEndian.PutUint16(hdr[0:], format)
	binary.BigEndian.PutUint64(hdr[2:], s.Index)
	if _, err := out.Write(hdr[:]); err != nil {
		return fmt.Errorf("write snapshot header: %w", err)
	}
	var zw *gzip.Writer
	bw := out
	if format == 2 {
		zw = gzip.NewWriter(out)
		bw = bufio.NewWriter(zw)
	}
	for _, k := range slices.Sorted(maps.Keys(s.Mirrors)) {
		if err := writeRecord(bw, recordMirror, s.Mirrors[k]); err != nil {
			return err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Topics)) {
		if err := writeRecord(bw, recordTopic, s.Topics[k]); err != nil {
			return err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Members)) {
		if err := writeRecord(bw, recordMember, s.Members[k]); err != nil {
			return err
		}
	}
	if err := bw.WriteByte(byte(recordEnd)); err != nil {
		return fmt.Errorf("write snapshot end marker: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			return fmt.Errorf("write snapshot: %w", err)
		}
		if err := out.Flush(); err != nil {
			return fmt.Errorf("write snapshot: %w", err)
		}
	}
	return nil
}

func writeRecord(w io.Writer, t recordType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode snapshot record type %d: %w", t, err)
	}
	if len(b) > maxRecordSize {
		return fmt.Errorf("snapshot record type %d is %d bytes, over the %d-byte limit", t, len(b), maxRecordSize)
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(b)))
	if _, err := w.Write(hdr[:]); err != nil {
		return fmt.Errorf("write snapshot record: %w", err)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write snapshot record: %w", err)
	}
	return nil
}

// readSnapshot builds a fresh State from bytes written by writeSnapshot.
func readSnapshot(r io.Reader) (*State, error) {
	br := bufio.NewReader(r)
	var hdr [10]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, fmt.Errorf("read snapshot header: %w", err)
	}
	var zr *gzip.Reader
	switch v := binary.BigEndian.Uint16(hdr[0:]); v {
	case 1:
	case 2:
		var err error
		if zr, err = gzip.NewReader(br); err != nil {
			return nil, fmt.Errorf("snapshot body: %w", err)
		}
		br = bufio.NewReader(zr)
	default:
		return nil, fmt.Errorf("snapshot format version %d is not readable by this kmirror build (it reads versions 1 and %d); upgrade kmirror", v, snapshotFormat)
	}
	s := NewState()
	s.Index = binary.BigEndian.Uint64(hdr[2:])
	for n := 0; ; n++ {
		b, err := br.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("snapshot truncated after %d records (no end marker): %w", n, noEOF(err))
		}
		t := recordType(b)
		switch t {
		case recordEnd:
			if zr != nil {
				// Read to the end so gzip checks its CRC and length.
				if _, err := io.Copy(io.Discard, br); err != nil {
					return nil, fmt.Errorf("snapshot body after %d records: %w", n, err)
				}
			}
			return s, nil
		case recordMirror, recordTopic, recordMember:
		default:
			return nil, fmt.Errorf("snapshot record %d has unknown type %d (written by a newer kmirror?); upgrade kmirror", n, t)
		}
		payload, err := readPayload(br)
		if err != nil {
			return nil, fmt.Errorf("snapshot record %d (type %d): %w", n, t, err)
		}
		if err := s.restoreRecord(t, payload); err != nil {
			return nil, fmt.Errorf("snapshot record %d: %w", n, err)
		}
	}
}

func readPayload(r io.Reader) ([]byte, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, fmt.Errorf("read length: %w", noEOF(err))
	}
	n := binary.BigEndian.Uint32(l[:])
	if n > maxRecordSize {
		return nil, fmt.Errorf("length %d is over the %d-byte limit (corrupt snapshot?)", n, maxRecordSize)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read payload: %w", noEOF(err))
	}
	return b, nil
}

func (s *State) restoreRecord(t recordType, payload []byte) error {
	switch t {
	case recordMirror:
		var m Mirror
		if err := json.Unmarshal(payload, &m); err != nil {
			return fmt.Errorf("decode mirror: %w", err)
		}
		if _, dup := s.Mirrors[m.Name]; dup {
			return fmt.Errorf("mirror %q appears twice", m.Name)
		}
		s.Mirrors[m.Name] = &m
	case recordTopic:
		var mt MirrorTopic
		if err := json.Unmarshal(payload, &mt); err != nil {
			return fmt.Errorf("decode topic: %w", err)
		}
		k := TopicKey(mt.Mirror, mt.Topic)
		if _, dup := s.Topics[k]; dup {
			return fmt.Errorf("topic %q appears twice", k)
		}
		s.Topics[k] = &mt
	case recordMember:
		var m Member
		if err := json.Unmarshal(payload, &m); err != nil {
			return fmt.Errorf("decode member: %w", err)
		}
		if _, dup := s.Members[m.ID]; dup {
			return fmt.Errorf("member %q appears twice", m.ID)
		}
		s.Members[m.ID] = &m
	}
	return nil
}

// noEOF turns a clean EOF into ErrUnexpectedEOF: inside a snapshot, the
// end of the data is always a truncation.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
