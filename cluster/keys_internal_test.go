package cluster

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestKeysRoundTripEveryTopicName(t *testing.T) {
	for _, name := range []string{"orders", "a-b_c", "%RETRY%g", "x|y", "a.b", "a=b"} {
		key := encodeKey(name)
		assert.Regexp(t, `^[-_=A-Za-z0-9]+$`, key, "a valid flat KV key")
		back, err := decodeKey(key)
		require.NoError(t, err)
		assert.Equal(t, name, back)
	}
	_, err := decodeKey("bad=7")
	assert.ErrorContains(t, err, "truncated escape")
	_, err = decodeKey("bad=ZZ")
	assert.ErrorContains(t, err, "bad escape")
}

func TestOptionsRefuseBadValues(t *testing.T) {
	_, err := Options{}.withDefaults()
	assert.ErrorContains(t, err, "Conn is required")
}
