package kwire

import "sync"

// bodies holds fetch response buffers for reuse (FetchResponse.Release):
// a fresh buffer per response cost a page fault per 4 KiB and the
// runtime's zeroing of every byte, about a tenth of kmirror's CPU at full
// speed (issue 20). Buffers left here are dropped by the garbage
// collector like any garbage, so an idle engine keeps none; while they
// are in use the engine's memory budget counts the fetch (its
// reservation) or the copies made from it (queue items).
var bodies sync.Pool // of *[]byte

// getBody returns a buffer of n bytes, reused when one large enough was
// released. Its contents are garbage: the caller overwrites all of it.
func getBody(n int) []byte {
	if p, ok := bodies.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putBody(b []byte) {
	if cap(b) > 0 {
		bodies.Put(&b)
	}
}
