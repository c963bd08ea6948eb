package protocol

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestQueryMessageHeaders(t *testing.T) {
	assert.Equal(t, "QUERY_MESSAGE", QueryMessage.String())
	h := &QueryMessageRequestHeader{Topic: "t", Key: "k", MaxNum: 32, BeginTimestamp: 1, EndTimestamp: 1712345678901, Unique: true}
	wire := h.Encode()
	assert.Equal(t, map[string]string{"topic": "t", "key": "k", "maxNum": "32", "beginTimestamp": "1",
		"endTimestamp": "1712345678901", "_UNIQUE_KEY_QUERY": "true"}, wire)
	var back QueryMessageRequestHeader
	require.NoError(t, back.Decode(wire))
	assert.Equal(t, *h, back)

	wire["_UNIQUE_KEY_QUERY"] = "yes"
	require.NoError(t, back.Decode(wire))
	assert.False(t, back.Unique, "only \"true\" makes a unique-key query, as in Java")

	for _, f := range []string{"topic", "key", "maxNum", "beginTimestamp", "endTimestamp"} {
		w := (&QueryMessageRequestHeader{Topic: "t", Key: "k"}).Encode()
		delete(w, f)
		assert.ErrorIs(t, new(QueryMessageRequestHeader).Decode(w), ErrMissingField, f)
	}
	w := h.Encode()
	w["maxNum"] = "99999999999"
	assert.ErrorIs(t, new(QueryMessageRequestHeader).Decode(w), ErrBadField)

	rh := &QueryMessageResponseHeader{IndexLastUpdateTimestamp: 5, IndexLastUpdatePhyoffset: 7}
	assert.Equal(t, map[string]string{"indexLastUpdateTimestamp": "5", "indexLastUpdatePhyoffset": "7"}, rh.Encode())
	var rback QueryMessageResponseHeader
	require.NoError(t, rback.Decode(rh.Encode()))
	assert.Equal(t, *rh, rback)
}
