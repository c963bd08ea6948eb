package broker

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash"
	"sync"
)

// A receipt handle is base64url (no padding) of
//
//	version(1)=1 | queueId(4) | queueOffset(8) | popTime(8, Unix ms) | invisibleUntil(8, Unix ms) |
//	attempt(4) | epoch(8) | mac(16)
//
// where mac is the first 16 bytes of HMAC-SHA256 over group, 0, topic, 0 and the 41 bytes
// before it, keyed with the broker's pop key (pop/key in the data directory). The group and
// topic are in the MAC, not in the handle: a handle shown to another group or topic fails
// its MAC as a forged one does. The epoch is unique per hand-out on this broker, so a
// handle names one delivery of one message.
const (
	handleVersion    = 1
	handlePayloadLen = 1 + 4 + 8 + 8 + 8 + 4 + 8
	handleMACLen     = 16
	handleLen        = handlePayloadLen + handleMACLen
)

// receipt is what a receipt handle says.
type receipt struct {
	queueID  int32
	offset   int64
	popTime  int64 // Unix ms
	deadline int64 // Unix ms: invisible until
	attempt  int32
	epoch    uint64
}

// handleKey is the MAC key with a pool of keyed HMACs: a receive of 32 messages computes 32
// MACs, and hmac.New costs two hashes' setup and allocations each time.
type handleKey struct {
	key  []byte
	macs sync.Pool // of *macState
}

// macState is a keyed HMAC with the buffers that stay with it, so that a MAC allocates
// nothing: the input written in one piece, not as conversions that escape to the hash.
type macState struct {
	h   hash.Hash
	in  []byte // group, 0, topic, 0, payload; or a handle being decoded
	sum [sha256.Size]byte
}

func newHandleKey(key []byte) *handleKey {
	k := &handleKey{key: key}
	k.macs.New = func() any { return &macState{h: hmac.New(sha256.New, k.key)} }
	return k
}

func (st *macState) mac(group, topic string, payload []byte, dst []byte) []byte {
	st.in = append(append(append(append(append(st.in[:0], group...), 0), topic...), 0), payload...)
	st.h.Reset()
	st.h.Write(st.in)
	return append(dst, st.h.Sum(st.sum[:0])[:handleMACLen]...)
}

func (k *handleKey) mac(group, topic string, payload []byte, dst []byte) []byte {
	st := k.macs.Get().(*macState)
	out := st.mac(group, topic, payload, dst)
	k.macs.Put(st)
	return out
}

// handleTextLen is a handle's length in base64url.
const handleTextLen = (handleLen*8 + 5) / 6

func encodeHandle(key *handleKey, group, topic string, r receipt) string {
	var b [handleLen]byte
	b[0] = handleVersion
	binary.BigEndian.PutUint32(b[1:], uint32(r.queueID))
	binary.BigEndian.PutUint64(b[5:], uint64(r.offset))
	binary.BigEndian.PutUint64(b[13:], uint64(r.popTime))
	binary.BigEndian.PutUint64(b[21:], uint64(r.deadline))
	binary.BigEndian.PutUint32(b[29:], uint32(r.attempt))
	binary.BigEndian.PutUint64(b[33:], r.epoch)
	key.mac(group, topic, b[:handlePayloadLen], b[:handlePayloadLen])
	var text [handleTextLen]byte
	base64.RawURLEncoding.Encode(text[:], b[:])
	return string(text[:])
}

// decodeHandle checks a handle's form and MAC for group and topic; every failure wraps
// ErrInvalidReceiptHandle.
func decodeHandle(key *handleKey, group, topic, h string) (receipt, error) {
	if base64.RawURLEncoding.DecodedLen(len(h)) != handleLen {
		return receipt{}, fmt.Errorf("%w: %d characters, want %d", ErrInvalidReceiptHandle, len(h), base64.RawURLEncoding.EncodedLen(handleLen))
	}
	st := key.macs.Get().(*macState)
	defer key.macs.Put(st)
	var b [handleLen]byte
	st.in = append(st.in[:0], h...) // the decoder's input, not a conversion of h per call
	if n, err := base64.RawURLEncoding.Decode(b[:], st.in); err != nil || n != handleLen {
		return receipt{}, fmt.Errorf("%w: not base64url", ErrInvalidReceiptHandle)
	}
	if b[0] != handleVersion {
		return receipt{}, fmt.Errorf("%w: version %d", ErrInvalidReceiptHandle, b[0])
	}
	var want [handleMACLen]byte
	if !hmac.Equal(b[handlePayloadLen:], st.mac(group, topic, b[:handlePayloadLen], want[:0])) {
		return receipt{}, fmt.Errorf("%w: not issued by this broker for group %q and topic %q", ErrInvalidReceiptHandle, group, topic)
	}
	return receipt{
		queueID:  int32(binary.BigEndian.Uint32(b[1:])),
		offset:   int64(binary.BigEndian.Uint64(b[5:])),
		popTime:  int64(binary.BigEndian.Uint64(b[13:])),
		deadline: int64(binary.BigEndian.Uint64(b[21:])),
		attempt:  int32(binary.BigEndian.Uint32(b[29:])),
		epoch:    binary.BigEndian.Uint64(b[33:]),
	}, nil
}
