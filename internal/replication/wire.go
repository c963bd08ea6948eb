package replication

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// The HA stream's frames. Every frame is a 4-byte big-endian length (of what follows), a
// 1-byte type and the payload. The handshake frames are JSON (rare, and readable in a
// capture); data and acks are fixed binary headers (one per chunk of the log).
const (
	frameHello    byte = 1 // replica → master: who it is and where its log ends
	frameWelcome  byte = 2 // master → replica: its history, and where the replica must cut
	frameData     byte = 3 // master → replica: raw records (or none: a heartbeat)
	frameAck      byte = 4 // replica → master: what it has written and fsynced
	frameSnapshot byte = 5 // master → replica: a named state snapshot (offsets, tables)

	maxFrame = 64 << 20
)

// hello is the replica's first frame.
type hello struct {
	Cluster     string  `json:"cluster"`
	BrokerName  string  `json:"broker_name"`
	Node        string  `json:"node"`
	SegmentSize int64   `json:"segment_size"`
	End         int64   `json:"end"`
	Epochs      []Epoch `json:"epochs"`
	// Set is the identity of the replica set the replica's history belongs to (omitted: none
	// yet, an empty or older history).
	Set SetID `json:"set,omitempty"`
}

// welcome is the master's answer: Error set means the replica is refused (the wrong
// replica set, by name or by identity, another segment size); TruncateTo below the replica's end means its log
// diverged there and must be cut before it follows.
type welcome struct {
	Error      string  `json:"error,omitempty"`
	Epochs     []Epoch `json:"epochs"`
	TruncateTo int64   `json:"truncate_to"`
	Epoch      int64   `json:"epoch"`
	// Set is the master's replica set: a replica whose history has none adopts it.
	Set SetID `json:"set,omitempty"`
}

// dataHeader precedes a chunk of raw records. Epoch and EpochStart say which master term
// wrote them (a chunk never spans two); MasterEnd and MasterTime (Unix ms) let the replica
// and its metrics tell how far behind it is.
type dataHeader struct {
	Epoch      int64
	EpochStart int64
	Offset     int64
	MasterEnd  int64
	MasterTime int64
}

const dataHeaderLen = 5 * 8

func writeFrame(w *bufio.Writer, typ byte, payload ...[]byte) error {
	n := 1
	for _, p := range payload {
		n += len(p)
	}
	var h [5]byte
	binary.BigEndian.PutUint32(h[:], uint32(n))
	h[4] = typ
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	for _, p := range payload {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

func writeJSON(w *bufio.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := writeFrame(w, typ, b); err != nil {
		return err
	}
	return w.Flush()
}

// readFrame reads one frame into buf (grown as needed) and returns its type and payload.
func readFrame(r *bufio.Reader, buf []byte) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, buf, err
	}
	n := int(binary.BigEndian.Uint32(h[:]))
	if n < 1 || n > maxFrame {
		return 0, buf, fmt.Errorf("frame of %d bytes: %w", n, ErrProtocol)
	}
	if cap(buf) < n-1 {
		buf = make([]byte, n-1)
	}
	buf = buf[:n-1]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, buf, err
	}
	return h[4], buf, nil
}

func readJSON(r *bufio.Reader, want byte, v any) error {
	typ, b, err := readFrame(r, nil)
	if err != nil {
		return err
	}
	if typ != want {
		return fmt.Errorf("frame type %d, expected %d: %w", typ, want, ErrProtocol)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode frame %d: %w: %w", typ, ErrProtocol, err)
	}
	return nil
}

func (h dataHeader) encode() []byte {
	b := make([]byte, dataHeaderLen)
	for i, v := range [...]int64{h.Epoch, h.EpochStart, h.Offset, h.MasterEnd, h.MasterTime} {
		binary.BigEndian.PutUint64(b[i*8:], uint64(v))
	}
	return b
}

func decodeData(b []byte) (dataHeader, []byte, error) {
	if len(b) < dataHeaderLen {
		return dataHeader{}, nil, fmt.Errorf("data frame of %d bytes: %w", len(b), ErrProtocol)
	}
	var v [5]int64
	for i := range v {
		v[i] = int64(binary.BigEndian.Uint64(b[i*8:]))
	}
	return dataHeader{v[0], v[1], v[2], v[3], v[4]}, b[dataHeaderLen:], nil
}

func encodeAck(written, flushed int64) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:], uint64(written))
	binary.BigEndian.PutUint64(b[8:], uint64(flushed))
	return b[:]
}

func decodeAck(b []byte) (written, flushed int64, err error) {
	if len(b) != 16 {
		return 0, 0, fmt.Errorf("ack frame of %d bytes: %w", len(b), ErrProtocol)
	}
	return int64(binary.BigEndian.Uint64(b)), int64(binary.BigEndian.Uint64(b[8:])), nil
}

func encodeSnapshot(name string, data []byte) [][]byte {
	var n [2]byte
	binary.BigEndian.PutUint16(n[:], uint16(len(name)))
	return [][]byte{n[:], []byte(name), data}
}

func decodeSnapshot(b []byte) (string, []byte, error) {
	if len(b) < 2 {
		return "", nil, fmt.Errorf("snapshot frame of %d bytes: %w", len(b), ErrProtocol)
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", nil, fmt.Errorf("snapshot frame name of %d bytes in %d: %w", n, len(b), ErrProtocol)
	}
	return string(b[2 : 2+n]), b[2+n:], nil
}
