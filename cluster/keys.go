package cluster

import (
	"fmt"

	"github.com/flowd-io/flowd/internal/subjects"
)

// encodeKey turns a broker or topic name into a KV key. Topic names may hold '%' and '|',
// which KV keys may not, so every byte outside [A-Za-z0-9_-] is written =XX (hex); '.' is
// escaped too, so that a name is one token and a watch never sees a hierarchy.
func encodeKey(name string) string { return subjects.Escape(name) }

// decodeKey reverses encodeKey.
func decodeKey(key string) (string, error) {
	name, err := subjects.Unescape(key)
	if err != nil {
		return "", fmt.Errorf("cluster: key %q: %w", key, err)
	}
	return name, nil
}
