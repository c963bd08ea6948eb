package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// encodeKey turns a broker or topic name into a KV key. Topic names may hold '%' and '|',
// which KV keys may not, so every byte outside [A-Za-z0-9_-] is written =XX (hex); '.' is
// escaped too, so that a name is one token and a watch never sees a hierarchy.
func encodeKey(name string) string {
	var b strings.Builder
	for i := range len(name) {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	return b.String()
}

// decodeKey reverses encodeKey.
func decodeKey(key string) (string, error) {
	if !strings.Contains(key, "=") {
		return key, nil
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		if key[i] != '=' {
			b.WriteByte(key[i])
			continue
		}
		if i+2 >= len(key) {
			return "", fmt.Errorf("cluster: key %q: truncated escape at %d", key, i)
		}
		v, err := strconv.ParseUint(key[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("cluster: key %q: bad escape at %d: %w", key, i, err)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
