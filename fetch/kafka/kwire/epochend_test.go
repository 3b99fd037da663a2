package kwire

import (
	"errors"
	"strings"
	"testing"
)

// epochEndBody encodes an OffsetForLeaderEpoch v3 response body (after the
// correlation ID) with one partition per entry.
func epochEndBody(parts ...struct {
	topic  string
	part   int32
	code   int16
	epoch  int32
	offset int64
}) []byte {
	w := &writer{}
	w.int32(0) // throttle
	w.int32(int32(len(parts)))
	for _, p := range parts {
		w.string(p.topic)
		w.int32(1)
		w.int16(p.code)
		w.int32(p.part)
		w.int32(p.epoch)
		w.int64(p.offset)
	}
	return w.b
}

func TestParseEpochEnd(t *testing.T) {
	type part = struct {
		topic  string
		part   int32
		code   int16
		epoch  int32
		offset int64
	}
	cases := []struct {
		name    string
		body    []byte
		want    EpochEnd
		wantErr string
		code    int16
	}{
		{name: "log end offset of the current epoch", body: epochEndBody(part{"t", 2, 0, 7, 1234}), want: EpochEnd{7, 1234}},
		{name: "other partitions are ignored", body: epochEndBody(part{"u", 2, 0, 1, 5}, part{"t", 2, 0, 7, 99}), want: EpochEnd{7, 99}},
		{name: "fenced leader epoch", body: epochEndBody(part{"t", 2, CodeFencedLeaderEpoch, -1, -1}), code: CodeFencedLeaderEpoch},
		{name: "no answer", body: epochEndBody(part{"t", 3, 0, 7, 1}), wantErr: "no answer for t/2"},
		{name: "truncated", body: epochEndBody(part{"t", 2, 0, 7, 1234})[:20], wantErr: "does not fit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseEpochEnd(c.body, "b:9092", "t", 2)
			var kerr *Error
			switch {
			case c.code != 0:
				if !errors.As(err, &kerr) || kerr.Code != c.code {
					t.Fatalf("got %v, %v; want kafka error %d", got, err, c.code)
				}
			case c.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got %v, %v; want error containing %q", got, err, c.wantErr)
				}
			case err != nil || got != c.want:
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
