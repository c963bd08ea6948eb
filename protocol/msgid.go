package protocol

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
)

// ErrBadMsgID is wrapped by ParseOffsetMsgID's errors.
var ErrBadMsgID = errors.New("bad offset message id")

// Lengths of an offsetMsgId in hex digits: address, port (4 bytes) and commit-log offset
// (8 bytes).
const (
	offsetMsgIDLenV4 = 2 * (4 + 4 + 8)
	offsetMsgIDLenV6 = 2 * (16 + 4 + 8)
)

const upperHex = "0123456789ABCDEF"

// OffsetMsgID is the id a broker gives a stored message: the store host's address, its port
// as 4 bytes and the commit-log offset as 8 bytes, big-endian, in upper-case hex. IPv4 (and
// IPv4-mapped IPv6) hosts give 32 digits, IPv6 hosts 56. It is what a send response's msgId
// carries and what VIEW_MESSAGE_BY_ID looks up; the Go client computes the same string for
// every message it decodes.
func OffsetMsgID(storeHost netip.AddrPort, commitLogOffset int64) string {
	var out [offsetMsgIDLenV6]byte
	return string(AppendOffsetMsgID(out[:0], storeHost, commitLogOffset))
}

// AppendOffsetMsgID appends OffsetMsgID(storeHost, commitLogOffset) to dst: a broker writes
// a send's answer with it, without making a string per message.
func AppendOffsetMsgID(dst []byte, storeHost netip.AddrPort, commitLogOffset int64) []byte {
	var raw [16 + 4 + 8]byte
	b := appendHost(raw[:0], storeHost)
	b = binary.BigEndian.AppendUint64(b, uint64(commitLogOffset))
	for _, c := range b {
		dst = append(dst, upperHex[c>>4], upperHex[c&0xF])
	}
	return dst
}

// ParseOffsetMsgID splits an offsetMsgId into the store host and the commit-log offset. Hex
// digits of either case are accepted.
func ParseOffsetMsgID(id string) (netip.AddrPort, int64, error) {
	var raw [16 + 4 + 8]byte
	var addrLen int
	switch len(id) {
	case offsetMsgIDLenV4:
		addrLen = 4
	case offsetMsgIDLenV6:
		addrLen = 16
	default:
		return netip.AddrPort{}, 0, fmt.Errorf("%w %q: %d hex digits, want %d (IPv4) or %d (IPv6)", ErrBadMsgID, truncateForError(id), len(id), offsetMsgIDLenV4, offsetMsgIDLenV6)
	}
	n, err := hex.Decode(raw[:], []byte(id))
	if err != nil {
		return netip.AddrPort{}, 0, fmt.Errorf("%w %q: %w", ErrBadMsgID, id, err)
	}
	b := raw[:n]
	var addr netip.Addr
	if addrLen == 4 {
		addr = netip.AddrFrom4([4]byte(b[:4]))
	} else {
		addr = netip.AddrFrom16([16]byte(b[:16]))
	}
	port := binary.BigEndian.Uint32(b[addrLen:])
	if port > 0xFFFF {
		return netip.AddrPort{}, 0, fmt.Errorf("%w %q: port %d is out of range", ErrBadMsgID, id, port)
	}
	offset := int64(binary.BigEndian.Uint64(b[addrLen+4:]))
	return netip.AddrPortFrom(addr, uint16(port)), offset, nil
}
