package store

import (
	"encoding/binary"
	"fmt"

	"github.com/flowd-io/flowd/protocol"
)

// walkStop says why walkMessages stopped.
type walkStop int

const (
	// walkNeedMore: the chunk ends before the next message does (or before its header);
	// read on from the returned position. At position 0 the message is larger than the chunk.
	walkNeedMore walkStop = iota
	// walkBlank: the blank marker that ends a segment starts at the returned position.
	walkBlank
	// walkZero: zeros where the next message would start: the end of what was written.
	walkZero
	// walkBad: what starts at the returned position is not a valid message; reason says why.
	walkBad
)

// walkMessages walks the stored messages in chunk, the commit log from pos, within the
// segment that ends at segEnd, and calls each on every valid one, in order. It is the one
// commit-log scan that recovery (which checks CRCs and cuts at the first bad message) and
// dispatch (which trusts what was written) share. It returns where it stopped and why, or
// each's error. The *msgInfo each gets is only valid during the call.
func walkMessages(chunk []byte, pos, segEnd int64, checkCRC bool, each func(*msgInfo) error) (p int64, stop walkStop, reason string, err error) {
	n := int64(len(chunk))
	// One msgInfo for the whole walk: each is handed to a func value, so a fresh one per
	// message would be a heap allocation per message.
	var m msgInfo
	for {
		if p+blankMin > n {
			return p, walkNeedMore, "", nil
		}
		total := int64(int32(binary.BigEndian.Uint32(chunk[p:])))
		magic := binary.BigEndian.Uint32(chunk[p+4:])
		switch {
		case total == 0 && magic == 0:
			return p, walkZero, "", nil
		case magic == protocol.MagicBlank:
			return p, walkBlank, "", nil
		case total < minStoredSize || pos+p+total > segEnd-blankMin:
			// Appends always leave room for a blank marker at the end of a segment.
			return p, walkBad, fmt.Sprintf("TOTALSIZE %d with magic 0x%08X", total, magic), nil
		}
		if p+total > n {
			return p, walkNeedMore, "", nil
		}
		var perr error
		m, perr = parseStored(chunk[p:p+total], pos+p, checkCRC)
		if perr != nil {
			return p, walkBad, perr.Error(), nil
		}
		if err := each(&m); err != nil {
			return p, walkBad, "", err
		}
		p += total
	}
}
