package kwire

import "hash/crc32"

// CRC-32C is linear over GF(2): for two messages of the same length,
// crc(a) ^ crc(b) is the raw CRC (register starting at 0, no final
// inversion) of a ^ b. A batch whose header fields change keeps its
// records, so its new CRC is the old one XOR the raw CRC of the changed
// header bytes, carried over the unchanged bytes that follow them: that
// carry is a multiplication by x^(8n) modulo the polynomial, computed
// in O(log n) (the method of zlib's crc32_combine). Rewrite uses it
// instead of a second pass over every byte of the batch (issue 20: the
// two full CRC passes per batch were a fifth of kmirror's CPU).

// castagnoliReversed is the CRC-32C polynomial, bit-reversed as the
// reflected register uses it.
const castagnoliReversed = 0x82f63b78

// multModP multiplies a and b modulo the polynomial (reflected: bit 31 is
// x^0).
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0 && a != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			a ^= m
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliReversed
		} else {
			b >>= 1
		}
	}
	return p
}

// x2n[k] is x^(2^k) modulo the polynomial.
var x2n = func() (t [64]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// shiftZeros returns the raw CRC register r after n more zero bytes:
// r times x^(8n) modulo the polynomial.
func shiftZeros(r uint32, n int) uint32 {
	op := uint32(1) << 31 // x^0
	for k, bits := 3, uint64(n); bits != 0; k, bits = k+1, bits>>1 {
		if bits&1 != 0 {
			op = multModP(x2n[k], op)
		}
	}
	return multModP(op, r)
}

// rawCRC is the CRC-32C register over p started at 0 with no final
// inversion (crc32.Update inverts on the way in and out).
func rawCRC(p []byte) uint32 { return ^crc32.Update(^uint32(0), castagnoli, p) }
