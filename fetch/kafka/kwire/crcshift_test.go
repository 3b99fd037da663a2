package kwire

import (
	"encoding/binary"
	"math/rand"
	"testing"
)

// TestRewriteDerivesTheCRC: the CRC Rewrite derives from the batch's old
// one equals a full computation over the rewritten batch, for batches of
// every size from a bare header to several MiB, with any attributes and
// producer fields before and after (the destination broker refuses a batch
// whose CRC is wrong).
func TestRewriteDerivesTheCRC(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	sizes := []int{batchHeaderSize, batchHeaderSize + 1, 100, 1000, 4096, 65_537, 1 << 20, 5<<20 + 13}
	for range 200 {
		sizes = append(sizes, batchHeaderSize+rng.Intn(200_000))
	}
	for _, n := range sizes {
		b := Batch(make([]byte, n))
		rng.Read(b)
		b[offMagic] = 2
		binary.BigEndian.PutUint32(b[offCRC:], b.ComputeCRC())
		for range 3 {
			b.Rewrite(rng.Int63(), int16(rng.Intn(1<<15)), rng.Int31())
			if got, want := b.CRC(), b.ComputeCRC(); got != want {
				t.Fatalf("%d-byte batch: derived CRC %#x, computed %#x", n, got, want)
			}
		}
	}
}

// TestShiftZeros: carrying a raw CRC over n zero bytes equals running the
// register over them.
func TestShiftZeros(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	for _, n := range []int{0, 1, 2, 3, 7, 8, 64, 1000, 123_457} {
		p := make([]byte, 16+n)
		rng.Read(p[:16])
		if got, want := shiftZeros(rawCRC(p[:16]), n), rawCRC(p); got != want {
			t.Fatalf("shift over %d zero bytes: %#x, want %#x", n, got, want)
		}
	}
}

// BenchmarkRewrite: rewriting a 16 KiB batch's producer fields, with the
// CRC derived, against computing it anew over the batch.
func BenchmarkRewrite(b *testing.B) {
	batch := Batch(make([]byte, 16<<10))
	rand.New(rand.NewSource(3)).Read(batch)
	batch[offMagic] = 2
	binary.BigEndian.PutUint32(batch[offCRC:], batch.ComputeCRC())
	b.Run("derived", func(b *testing.B) {
		b.SetBytes(int64(len(batch)))
		for i := range b.N {
			batch.Rewrite(int64(i), 1, int32(i))
		}
	})
	b.Run("full pass", func(b *testing.B) {
		b.SetBytes(int64(len(batch)))
		for range b.N {
			binary.BigEndian.PutUint32(batch[offCRC:], batch.ComputeCRC())
		}
	})
}
