package kwire

import (
	"math/bits"
	"sync"
)

// Record buffers are pooled by size class: a fetch reads each partition's
// records straight from the socket into a buffer of its own
// (FetchResponse.Detach), which the data path keeps, without copying, for
// as long as any batch of it waits to be produced (issue 20: a copy of
// every batch cost a tenth of kmirror's CPU, and a fresh buffer per
// response a page fault per 4 KiB and the runtime's zeroing of every
// byte). A class is a quarter step between powers of two, so a buffer
// wastes under a quarter of its capacity, which the memory budget counts
// (RecordsCap). Buffers left in the pools are dropped by the garbage
// collector like any garbage, so an idle engine keeps none.
var recordPools [bufClasses]sync.Pool // of *[]byte

const (
	minBufShift = 12 // 4 KiB: the smallest class
	maxBufShift = 30 // 1 GiB: the largest answer readAnswer accepts
	bufClasses  = (maxBufShift-minBufShift)*4 + 1
)

// bufClass returns the index and size (bytes) of the smallest class that
// holds n bytes.
func bufClass(n int) (idx, size int) {
	if n <= 1<<minBufShift {
		return 0, 1 << minBufShift
	}
	shift := bits.Len(uint(n-1)) - 1 // 2^shift < n <= 2^(shift+1)
	step := 1 << (shift - 2)         // a quarter of 2^shift
	q := (n - 1<<shift + step - 1) / step
	return (shift-minBufShift)*4 + q, 1<<shift + q*step
}

// getBuf returns a buffer of n bytes, reused when one of its class was
// released. Its contents are garbage: the caller overwrites all of it. A
// buffer under the smallest class is made to size and not pooled: an
// answer of many tiny record sets (idle partitions with a record each, or
// a hostile broker's 1-byte sets) would otherwise hold up to ~95x its own
// size in 4 KiB buffers (issue 20 review), where now every buffer wastes
// under a quarter of its capacity whatever the set sizes.
func getBuf(n int) []byte {
	if n <= 0 {
		return nil
	}
	if n < 1<<minBufShift {
		return make([]byte, n)
	}
	idx, size := bufClass(n)
	if idx >= bufClasses {
		return make([]byte, n)
	}
	if p, ok := recordPools[idx].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return make([]byte, n, size)
}

// putBuf gives b back to its class's pool (one that getBuf did not make
// for a class, such as one under the smallest class, is dropped).
func putBuf(b []byte) {
	if cap(b) == 0 {
		return
	}
	idx, size := bufClass(cap(b))
	if idx >= bufClasses || size != cap(b) {
		return
	}
	b = b[:0]
	recordPools[idx].Put(&b)
}

// RecordsCap is the memory (bytes) a detached record buffer holds: its
// class's size, which the caller's memory budget counts.
func RecordsCap(records []byte) int64 { return int64(cap(records)) }

// ReleaseRecords gives back a record buffer taken with
// FetchResponse.Detach, once nothing reads or writes any slice of it.
func ReleaseRecords(b []byte) { putBuf(b) }
