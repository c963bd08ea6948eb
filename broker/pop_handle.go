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
	macs sync.Pool
}

func newHandleKey(key []byte) *handleKey {
	k := &handleKey{key: key}
	k.macs.New = func() any { return hmac.New(sha256.New, k.key) }
	return k
}

func (k *handleKey) mac(group, topic string, payload []byte, dst []byte) []byte {
	m := k.macs.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(group))
	m.Write([]byte{0})
	m.Write([]byte(topic))
	m.Write([]byte{0})
	m.Write(payload)
	var sum [sha256.Size]byte
	out := append(dst, m.Sum(sum[:0])[:handleMACLen]...)
	k.macs.Put(m)
	return out
}

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
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// decodeHandle checks a handle's form and MAC for group and topic; every failure wraps
// ErrInvalidReceiptHandle.
func decodeHandle(key *handleKey, group, topic, h string) (receipt, error) {
	if base64.RawURLEncoding.DecodedLen(len(h)) != handleLen {
		return receipt{}, fmt.Errorf("%w: %d characters, want %d", ErrInvalidReceiptHandle, len(h), base64.RawURLEncoding.EncodedLen(handleLen))
	}
	var b [handleLen]byte
	if n, err := base64.RawURLEncoding.Decode(b[:], []byte(h)); err != nil || n != handleLen {
		return receipt{}, fmt.Errorf("%w: not base64url", ErrInvalidReceiptHandle)
	}
	if b[0] != handleVersion {
		return receipt{}, fmt.Errorf("%w: version %d", ErrInvalidReceiptHandle, b[0])
	}
	var want [handleMACLen]byte
	if !hmac.Equal(b[handlePayloadLen:], key.mac(group, topic, b[:handlePayloadLen], want[:0])) {
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
