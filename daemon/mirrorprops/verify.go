package mirrorprops

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kmirror/kmirror/daemon/api"
)

// Background verification properties (issue 22, section 4): each owner
// compares the destination with the source for the offsets its partitions
// have mirrored, within a rate.
const (
	propVerifyMode    = "verify.mode"
	propVerifyRecords = "verify.records.per.sec"
	propVerifyBytes   = "verify.bytes.per.sec"
)

// Background verification modes.
const (
	VerifyOff     = "off"
	VerifySampled = "sampled" // random mirrored offsets, one record each
	VerifyFull    = "full"    // a rolling pass over every mirrored record
)

// Background verification defaults: per member, for the mirror's
// partitions it owns.
const (
	DefaultVerifyRecords = 1000
	DefaultVerifyBytes   = 1 << 20
)

// Verify is a mirror's background verification: Mode, and the records and
// bytes per second each member may read from each cluster for it.
type Verify struct {
	Mode          string
	RecordsPerSec int64
	BytesPerSec   int64
}

// parseVerify reads the verify.* properties; errors say what to write.
func parseVerify(props map[string]string) (Verify, error) {
	v := Verify{Mode: VerifyOff, RecordsPerSec: DefaultVerifyRecords, BytesPerSec: DefaultVerifyBytes}
	switch m := strings.TrimSpace(props[propVerifyMode]); m {
	case "", VerifyOff:
	case VerifySampled, VerifyFull:
		v.Mode = m
	default:
		return Verify{}, fmt.Errorf("%w: %s=%s: give off, sampled (random mirrored records) or full (a rolling pass over every mirrored record)",
			api.ErrInvalid, propVerifyMode, m)
	}
	for _, r := range []struct {
		prop string
		to   *int64
	}{{propVerifyRecords, &v.RecordsPerSec}, {propVerifyBytes, &v.BytesPerSec}} {
		if s := strings.TrimSpace(props[r.prop]); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 1 {
				return Verify{}, fmt.Errorf("%w: %s=%s: give a positive whole number per second, per member", api.ErrInvalid, r.prop, s)
			}
			*r.to = n
		}
	}
	return v, nil
}
