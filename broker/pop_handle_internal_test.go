package broker

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReceiptHandleLayout: a handle is the documented layout (docs/pop.md) with the MAC over
// group, 0, topic, 0 and the payload, computed here independently: handles issued before a
// restart, or by an older flowd with the same key, keep verifying.
func TestReceiptHandleLayout(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	k := newHandleKey(key)
	r := receipt{queueID: 7, offset: 1 << 40, popTime: 1_700_000_000_000, deadline: 1_700_000_030_000, attempt: 3, epoch: 99}
	for range 3 { // the pooled HMAC and its buffer reused
		h := encodeHandle(k, "group", "topic", r)
		require.Len(t, h, handleTextLen)
		raw, err := base64.RawURLEncoding.DecodeString(h)
		require.NoError(t, err)
		require.Len(t, raw, handleLen)
		require.EqualValues(t, handleVersion, raw[0])
		require.EqualValues(t, 7, binary.BigEndian.Uint32(raw[1:]))
		require.EqualValues(t, 1<<40, binary.BigEndian.Uint64(raw[5:]))
		require.EqualValues(t, 1_700_000_000_000, binary.BigEndian.Uint64(raw[13:]))
		require.EqualValues(t, 1_700_000_030_000, binary.BigEndian.Uint64(raw[21:]))
		require.EqualValues(t, 3, binary.BigEndian.Uint32(raw[29:]))
		require.EqualValues(t, 99, binary.BigEndian.Uint64(raw[33:]))
		m := hmac.New(sha256.New, key)
		m.Write([]byte("group\x00topic\x00"))
		m.Write(raw[:handlePayloadLen])
		require.Equal(t, m.Sum(nil)[:handleMACLen], raw[handlePayloadLen:])

		got, err := decodeHandle(k, "group", "topic", h)
		require.NoError(t, err)
		require.Equal(t, r, got)
		_, err = decodeHandle(k, "group", "topicX", h)
		require.ErrorIs(t, err, ErrInvalidReceiptHandle)
		_, err = decodeHandle(k, "grou", "ptopic", h)
		require.ErrorIs(t, err, ErrInvalidReceiptHandle, "the separator keeps group and topic apart")
	}
}
