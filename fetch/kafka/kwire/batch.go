package kwire

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Offsets of the v2 record batch header fields (from the start of the batch).
const (
	offBaseOffset      = 0
	offLength          = 8
	offLeaderEpoch     = 12
	offMagic           = 16
	offCRC             = 17
	offAttributes      = 21
	offLastOffsetDelta = 23
	offFirstTimestamp  = 27
	offMaxTimestamp    = 35
	offProducerID      = 43
	offProducerEpoch   = 51
	offBaseSequence    = 53
	offRecordCount     = 57
	batchHeaderSize    = 61
)

// Batch attribute bits.
const (
	attrCompressionMask = 0x07
	attrLogAppendTime   = 0x08
	attrTransactional   = 0x10
	attrControl         = 0x20
)

// Batch is a view over one v2 record batch as raw bytes.
type Batch []byte

func (b Batch) BaseOffset() int64      { return int64(binary.BigEndian.Uint64(b[offBaseOffset:])) }
func (b Batch) LeaderEpoch() int32     { return int32(binary.BigEndian.Uint32(b[offLeaderEpoch:])) }
func (b Batch) Attributes() int16      { return int16(binary.BigEndian.Uint16(b[offAttributes:])) }
func (b Batch) LastOffsetDelta() int32 { return int32(binary.BigEndian.Uint32(b[offLastOffsetDelta:])) }
func (b Batch) FirstTimestamp() int64  { return int64(binary.BigEndian.Uint64(b[offFirstTimestamp:])) }
func (b Batch) MaxTimestamp() int64    { return int64(binary.BigEndian.Uint64(b[offMaxTimestamp:])) }
func (b Batch) ProducerID() int64      { return int64(binary.BigEndian.Uint64(b[offProducerID:])) }
func (b Batch) ProducerEpoch() int16   { return int16(binary.BigEndian.Uint16(b[offProducerEpoch:])) }
func (b Batch) BaseSequence() int32    { return int32(binary.BigEndian.Uint32(b[offBaseSequence:])) }
func (b Batch) RecordCount() int32     { return int32(binary.BigEndian.Uint32(b[offRecordCount:])) }
func (b Batch) LastOffset() int64      { return b.BaseOffset() + int64(b.LastOffsetDelta()) }
func (b Batch) Compression() int8      { return int8(b.Attributes() & attrCompressionMask) }
func (b Batch) IsControl() bool        { return b.Attributes()&attrControl != 0 }
func (b Batch) IsTransactional() bool  { return b.Attributes()&attrTransactional != 0 }
func (b Batch) IsLogAppendTime() bool  { return b.Attributes()&attrLogAppendTime != 0 }
func (b Batch) CRC() uint32            { return binary.BigEndian.Uint32(b[offCRC:]) }
func (b Batch) ComputeCRC() uint32     { return crc32.Checksum(b[offAttributes:], castagnoli) }
func (b Batch) IsContiguous() bool     { return b.LastOffsetDelta() == b.RecordCount()-1 }
func (b Batch) records() []byte        { return b[batchHeaderSize:] }
func (b Batch) String() string {
	return fmt.Sprintf("batch[%d..%d n=%d attrs=%#x pid=%d]", b.BaseOffset(), b.LastOffset(), b.RecordCount(), b.Attributes(), b.ProducerID())
}

// Forwardable reports whether the batch can be sent to the destination as
// is, with only its producer fields rewritten: a contiguous CreateTime batch.
// Compacted batches (holes) and LogAppendTime batches must be re-encoded.
func (b Batch) Forwardable() bool { return b.IsContiguous() && !b.IsLogAppendTime() }

// SplitBatches cuts a record set (the Records field of a fetch response)
// into batches. A trailing partial batch, which brokers send when a batch
// does not fit the fetch size, is returned as the number of bytes it needs:
// partialNeed > 0 means "fetch at least this many bytes to make progress".
// Batches alias set, except those converted from legacy (v0/v1) message
// sets, which are buffers of their own (legacy.go, Aliases).
func SplitBatches(set []byte) (batches []Batch, partialNeed int, err error) {
	for len(set) > 0 {
		if len(set) > offMagic && set[offMagic] < 2 {
			converted, rest, need, err := convertLegacy(set)
			batches = append(batches, converted...)
			if err != nil || need > 0 {
				return batches, need, err
			}
			set = rest
			continue
		}
		if len(set) < batchHeaderSize {
			return batches, batchHeaderSize, nil
		}
		size := int(int32(binary.BigEndian.Uint32(set[offLength:]))) + 12
		if size < batchHeaderSize {
			return batches, 0, fmt.Errorf("record batch at offset %d declares %d bytes", int64(binary.BigEndian.Uint64(set)), size)
		}
		if magic := set[offMagic]; magic != 2 {
			return batches, 0, fmt.Errorf("record batch at offset %d has magic %d: kmirror reads message formats v0, v1 and v2 only", int64(binary.BigEndian.Uint64(set)), magic)
		}
		if size > len(set) {
			return batches, size, nil
		}
		b := Batch(set[:size:size])
		if got, want := b.ComputeCRC(), b.CRC(); got != want {
			return batches, 0, fmt.Errorf("record batch at offset %d fails its CRC (%#x != %#x): corrupt data from the broker", b.BaseOffset(), got, want)
		}
		batches = append(batches, b)
		set = set[size:]
	}
	return batches, 0, nil
}

// Rewrite turns a fetched batch in place into the batch an idempotent
// producer sends: base offset 0, no leader epoch, the given producer
// identity and base sequence, the transactional bit cleared (the
// destination holds only committed data, so no transaction is ever opened
// there), and its CRC-32C updated for the changed fields. The CRC is
// derived from the batch's current one (crcshift.go), which must be right:
// SplitBatches verified it, and a batch kmirror encodes gets a computed
// one; a wrong CRC stays wrong, and the destination broker, which checks
// every batch, refuses it (CORRUPT_MESSAGE).
func (b Batch) Rewrite(producerID int64, epoch int16, baseSequence int32) {
	// Only the attributes (offsets 21-22) and the producer fields (43-56)
	// change inside the CRC's range (offset 21 to the end); the base
	// offset and leader epoch are outside it.
	var old [offRecordCount - offAttributes]byte
	copy(old[:], b[offAttributes:offRecordCount])
	binary.BigEndian.PutUint64(b[offBaseOffset:], 0)
	binary.BigEndian.PutUint32(b[offLeaderEpoch:], 0xffffffff)
	binary.BigEndian.PutUint16(b[offAttributes:], uint16(b.Attributes()&^attrTransactional))
	binary.BigEndian.PutUint64(b[offProducerID:], uint64(producerID))
	binary.BigEndian.PutUint16(b[offProducerEpoch:], uint16(epoch))
	binary.BigEndian.PutUint32(b[offBaseSequence:], uint32(baseSequence))
	for i := range old {
		old[i] ^= b[offAttributes+i]
	}
	delta := shiftZeros(rawCRC(old[:]), len(b)-offRecordCount)
	binary.BigEndian.PutUint32(b[offCRC:], b.CRC()^delta)
}

// NextSequence is the base sequence that follows a batch of n records
// starting at seq; sequences wrap at 2^31-1 like the Java producer's.
func NextSequence(seq int32, n int32) int32 {
	s := int64(seq) + int64(n)
	if s > 1<<31-1 {
		s -= 1 << 31
	}
	return int32(s)
}
