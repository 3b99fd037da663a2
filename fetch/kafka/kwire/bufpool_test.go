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

// TestReleasedBodyIsReused: a fetch response's buffer, released, serves
// the next response that fits in it.
func TestReleasedBodyIsReused(t *testing.T) {
	// The pool may drop buffers at any GC: try a few times.
	for range 10 {
		b := getBody(1 << 20)
		(&FetchResponse{body: b}).Release()
		if c := getBody(1000); cap(c) == 1<<20 && &c[0] == &b[0] {
			return
		}
	}
	t.Fatal("a released fetch buffer was never handed out again")
}
