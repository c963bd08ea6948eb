package config

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Size is a byte count, written as a number of bytes (4194304) or with a binary unit
// ("4MiB"; B, KiB, MiB, GiB and TiB).
type Size int64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// ParseSize parses "64MiB", "512B" or "1048576".
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<63-1)/mult {
		return 0, fmt.Errorf("size %q: want a byte count or a number with B, KiB, MiB, GiB or TiB", s)
	}
	return Size(n * mult), nil
}

// String writes the size with the largest unit that divides it.
func (s Size) String() string {
	for _, u := range sizeUnits {
		if s != 0 && int64(s)%u.mult == 0 {
			return strconv.FormatInt(int64(s)/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// UnmarshalYAML accepts a byte count or a string with a unit. Its errors are yaml type
// errors, so that yaml goes on decoding the rest of the document and reports them all.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a size must be a scalar", n.Line)}}
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*s = v
	return nil
}

// MarshalYAML writes the String form.
func (s Size) MarshalYAML() (any, error) { return s.String(), nil }
