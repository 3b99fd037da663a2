package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ByteSize is a number of bytes. In YAML it is a plain integer or an integer
// with a binary unit: 512KiB, 256MiB, 1GiB, 1TiB (or B).
type ByteSize int64

// Binary units of ByteSize.
const (
	KiB ByteSize = 1 << (10 * (iota + 1))
	MiB
	GiB
	TiB
)

var byteUnits = []struct {
	name string
	size ByteSize
}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", 1}}

// ParseByteSize parses a plain integer or an integer with one of the units
// B, KiB, MiB, GiB or TiB, such as "256MiB".
func ParseByteSize(s string) (ByteSize, error) {
	text := strings.TrimSpace(s)
	unit := ByteSize(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(text, u.name) {
			text, unit = strings.TrimSpace(strings.TrimSuffix(text, u.name)), u.size
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q: want a whole number of bytes, optionally with a unit B, KiB, MiB, GiB or TiB, such as 256MiB", s)
	}
	if n > math.MaxInt64/int64(unit) {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return ByteSize(n) * unit, nil
}

// UnmarshalYAML implements yaml.Unmarshaler. It reports a bad value as a
// yaml.TypeError so Load can name the key.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: want a size such as 256MiB", n.Line)}}
	}
	size, err := ParseByteSize(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*b = size
	return nil
}

// String formats b in the largest unit that divides it, such as "256MiB".
func (b ByteSize) String() string {
	for _, u := range byteUnits {
		if b != 0 && b%u.size == 0 {
			return fmt.Sprintf("%d%s", b/u.size, u.name)
		}
	}
	return fmt.Sprintf("%dB", int64(b))
}
