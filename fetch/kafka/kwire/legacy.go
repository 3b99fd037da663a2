package kwire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"unsafe"

	"github.com/segmentio/kafka-go/compress"
)

// Legacy message sets (message format v0 and v1, Kafka before 0.11; a
// 2.x or 3.x topic may still hold them: message.format.version < 0.11, or
// data written before an upgrade) are read as v2 batches: Kafka 4.x
// brokers refuse produce requests in v0/v1 (KIP-724, KIP-896), so
// kmirror converts them on the way (issue 21). Each entry is
//
//	offset int64, message size int32, crc int32 (CRC-32 IEEE of the rest),
//	magic int8, attributes int8, [timestamp int64: v1 only], key bytes,
//	value bytes
//
// and a compressed message (attributes & 0x07 != 0) holds a message set in
// its value, whose offsets are relative to the wrapper's in v1 (the
// wrapper's offset is its last record's) and absolute in v0 (Java's
// AbstractLegacyRecordBatch). Offsets, keys and values are kept; headers
// are empty (v0/v1 have none); each record's timestamp is the one a
// consumer of the source sees (v0: -1, no timestamp; a LogAppendTime
// wrapper's: the wrapper's), written as CreateTime. A compressed wrapper
// becomes one batch with its codec; a run of uncompressed messages, batches
// of at most convertedBatchBytes. A converted batch is a buffer of its own
// (it does not alias the record set: Aliases), carries no leader epoch
// (-1: Kafka keeps none for v0/v1 data) and no producer (-1).
const (
	legacyOverhead      = 12 // offset, message size
	legacyMinMessage    = 14 // crc, magic, attributes, key and value lengths
	convertedBatchBytes = 512 << 10
)

// Aliases reports whether b is a slice of set (a batch as fetched), not a
// batch of its own (converted from a legacy message set). Addresses are
// compared only; nothing is read through them.
func Aliases(set []byte, b Batch) bool {
	if len(b) == 0 || cap(set) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(set)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return p >= start && p < start+uintptr(cap(set))
}

// convertLegacy converts the run of legacy messages at the start of set
// (up to the first v2 batch or the end). partialNeed > 0: set ends in a
// partial message of that many bytes (fetch at least that much).
func convertLegacy(set []byte) (batches []Batch, rest []byte, partialNeed int, err error) {
	var run []Record // uncompressed messages not yet in a batch
	runBytes := 0
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		b, err := encodeBatch(run, 0, true)
		if err != nil {
			return err
		}
		batches = append(batches, b)
		run, runBytes = nil, 0
		return nil
	}
	for len(set) > offMagic && set[offMagic] < 2 {
		offset := int64(binary.BigEndian.Uint64(set))
		size := legacyOverhead + int(int32(binary.BigEndian.Uint32(set[offLength:])))
		if size < legacyOverhead+legacyMinMessage {
			return nil, nil, 0, fmt.Errorf("legacy message at offset %d declares %d bytes", offset, size)
		}
		if size > len(set) {
			partialNeed = size
			break
		}
		msg := set[legacyOverhead:size]
		set = set[size:]
		m, err := parseLegacy(offset, msg)
		if err != nil {
			return nil, nil, 0, err
		}
		if m.codec == 0 {
			run = append(run, m.rec)
			if runBytes += len(msg); runBytes >= convertedBatchBytes {
				if err := flush(); err != nil {
					return nil, nil, 0, err
				}
			}
			continue
		}
		if err := flush(); err != nil {
			return nil, nil, 0, err
		}
		inner, err := m.inner(offset)
		if err != nil {
			return nil, nil, 0, err
		}
		if len(inner) == 0 {
			continue
		}
		b, err := encodeBatch(inner, m.codec, true)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("legacy message at offset %d: %w", offset, err)
		}
		batches = append(batches, b)
	}
	if err := flush(); err != nil {
		return nil, nil, 0, err
	}
	if partialNeed == 0 && len(set) > 0 && len(set) <= offMagic {
		partialNeed = batchHeaderSize
	}
	return batches, set, partialNeed, nil
}

// legacyMessage is one parsed v0/v1 message.
type legacyMessage struct {
	rec       Record
	magic     int8
	codec     int8
	logAppend bool
}

// parseLegacy parses one v0/v1 message (after its offset and size) and
// checks its CRC.
func parseLegacy(offset int64, msg []byte) (legacyMessage, error) {
	if got, want := crc32.ChecksumIEEE(msg[4:]), binary.BigEndian.Uint32(msg); got != want {
		return legacyMessage{}, fmt.Errorf("legacy message at offset %d fails its CRC (%#x != %#x): corrupt data from the broker", offset, got, want)
	}
	m := legacyMessage{magic: int8(msg[4]), codec: int8(msg[5] & attrCompressionMask)}
	m.rec.Offset, m.rec.Timestamp = offset, -1
	p := msg[6:]
	if m.magic == 1 {
		if len(p) < 8 {
			return m, fmt.Errorf("legacy message at offset %d: v1 message too short for its timestamp", offset)
		}
		m.rec.Timestamp = int64(binary.BigEndian.Uint64(p))
		m.logAppend = msg[5]&attrLogAppendTime != 0
		p = p[8:]
	}
	var ok bool
	if m.rec.Key, p, ok = legacyBytes(p); ok {
		m.rec.Value, p, ok = legacyBytes(p)
	}
	if !ok || len(p) != 0 {
		return m, fmt.Errorf("legacy message at offset %d (magic %d): key and value do not fit its %d bytes", offset, m.magic, len(msg))
	}
	return m, nil
}

// legacyBytes reads an int32-length byte string (-1: null).
func legacyBytes(p []byte) (b, rest []byte, ok bool) {
	if len(p) < 4 {
		return nil, p, false
	}
	n := int(int32(binary.BigEndian.Uint32(p)))
	p = p[4:]
	if n < 0 {
		return nil, p, true
	}
	if n > len(p) {
		return nil, p, false
	}
	return p[:n:n], p[n:], true
}

// inner decompresses a wrapper message (at offset) and returns its records
// with absolute offsets and the timestamps a consumer sees.
func (m legacyMessage) inner(offset int64) ([]Record, error) {
	c := compress.Compression(m.codec).Codec()
	if c == nil || m.codec > 3 {
		return nil, fmt.Errorf("legacy message at offset %d: unknown compression codec %d", offset, m.codec)
	}
	rd := c.NewReader(bytes.NewReader(m.rec.Value))
	plain, err := io.ReadAll(rd)
	rd.Close()
	if err != nil {
		if m.codec == 3 && m.magic == 0 {
			return nil, fmt.Errorf("legacy message at offset %d: LZ4 in message format v0 (Kafka before 0.10 wrote a wrong frame checksum, KAFKA-3160) cannot be read: %w", offset, err)
		}
		return nil, fmt.Errorf("legacy message at offset %d: decompress %s: %w", offset, c.Name(), err)
	}
	var recs []Record
	for len(plain) > 0 {
		if len(plain) < legacyOverhead+legacyMinMessage {
			return nil, fmt.Errorf("legacy message at offset %d: compressed message set ends in %d stray bytes", offset, len(plain))
		}
		at := int64(binary.BigEndian.Uint64(plain))
		size := legacyOverhead + int(int32(binary.BigEndian.Uint32(plain[offLength:])))
		if size < legacyOverhead+legacyMinMessage || size > len(plain) {
			return nil, fmt.Errorf("legacy message at offset %d: inner message declares %d bytes of %d left", offset, size, len(plain))
		}
		im, err := parseLegacy(at, plain[legacyOverhead:size])
		if err != nil {
			return nil, fmt.Errorf("inside the compressed message at offset %d: %w", offset, err)
		}
		if im.codec != 0 {
			return nil, fmt.Errorf("legacy message at offset %d: a compressed message inside a compressed message", offset)
		}
		if m.logAppend {
			im.rec.Timestamp = m.rec.Timestamp
		}
		recs = append(recs, im.rec)
		plain = plain[size:]
	}
	if m.magic > 0 && len(recs) > 0 {
		base := offset - recs[len(recs)-1].Offset
		for i := range recs {
			recs[i].Offset += base
		}
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Offset <= recs[i-1].Offset {
			return nil, fmt.Errorf("legacy message at offset %d: inner offsets %d then %d do not increase", offset, recs[i-1].Offset, recs[i].Offset)
		}
	}
	return recs, nil
}
