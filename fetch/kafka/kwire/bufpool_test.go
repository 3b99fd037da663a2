package kwire

import (
	"bytes"
	"testing"
)

// TestWriterRefsSendTheSameBytes: a request whose byte strings are sent in
// place (bytesRef, written with writev) has the length and bytes of the
// same request with them copied in.
func TestWriterRefsSendTheSameBytes(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 300), []byte("second batch")
	build := func(ref bool) []byte {
		w := &writer{}
		w.int32(0)
		w.string("topic")
		for _, p := range [][]byte{a, nil, b} {
			if ref {
				w.bytesRef(p)
			} else {
				w.bytes(p)
			}
			w.int16(7)
		}
		var out bytes.Buffer
		bufs := w.buffers()
		if _, err := bufs.WriteTo(&out); err != nil {
			t.Fatal(err)
		}
		if out.Len() != w.size() {
			t.Fatalf("size %d, %d bytes written", w.size(), out.Len())
		}
		return out.Bytes()
	}
	if copied, inPlace := build(false), build(true); !bytes.Equal(copied, inPlace) {
		t.Fatalf("in place:\n%x\ncopied:\n%x", inPlace, copied)
	}
}

// TestReleasedRecordsAreReused: a fetch response's record buffer,
// released, serves the next one of its size class.
func TestReleasedRecordsAreReused(t *testing.T) {
	// The pool may drop buffers at any GC: try a few times.
	for range 10 {
		b := getBuf(1 << 20)
		(&FetchResponse{Partitions: []FetchedPartition{{Records: b}}}).Release()
		if c := getBuf(1<<20 - 1000); cap(c) == 1<<20 && &c[0] == &b[0] {
			return
		}
	}
	t.Fatal("a released record buffer was never handed out again")
}

// TestBufClasses: every size gets the smallest class that holds it, a
// class wastes under a quarter of its size, and only buffers of a class
// size go back to a pool.
func TestBufClasses(t *testing.T) {
	prev := 0
	for n := 1; n < 1<<22; n += 1 + n/97 {
		idx, size := bufClass(n)
		if size < n {
			t.Fatalf("%d bytes: class %d of %d bytes", n, idx, size)
		}
		if n > 1<<minBufShift && size-n >= size/4+1 {
			t.Fatalf("%d bytes: class of %d bytes wastes %d", n, size, size-n)
		}
		if idx < prev {
			t.Fatalf("%d bytes: class %d after %d", n, idx, prev)
		}
		prev = idx
		if i2, s2 := bufClass(size); i2 != idx || s2 != size {
			t.Fatalf("class %d of %d bytes maps to class %d of %d", idx, size, i2, s2)
		}
		if idx > 0 {
			if _, below := bufClass(size - 1); below != size {
				t.Fatalf("%d bytes: not the class of %d", size-1, size)
			}
			if _, lower := bufClass(size + 1); lower == size {
				t.Fatalf("%d bytes fit a class of %d", size+1, size)
			}
		}
	}
	if _, size := bufClass(1 << 30); size != 1<<30 {
		t.Fatalf("the largest answer's class: %d bytes", size)
	}
}
