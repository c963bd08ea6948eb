package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Key-index lookups: see index.go for the layout and the "Reads" notes.

// lookup returns the commit-log offsets of entries with hash whose time may lie in
// [begin, end], newest first (at most maxQueryCandidates, duplicates removed), and the last
// file's end timestamp and offset (RocketMQ's indexLastUpdateTimestamp and
// indexLastUpdatePhyoffset).
func (x *keyIndex) lookup(hash int32, begin, end int64) (offs []int64, lastTs, lastPhy int64, err error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if n := len(x.files); n > 0 {
		lastTs, lastPhy = x.files[n-1].hdr.endTs, x.files[n-1].hdr.endPhy
	}
	slot := hash % x.slots
	seen := map[int64]bool{}
	for fi := len(x.files) - 1; fi >= 0 && len(offs) < maxQueryCandidates; fi-- {
		f := x.files[fi]
		h := f.hdr
		if h.count <= 1 || h.beginTs > end {
			continue
		}
		if h.endTs+999 < begin { // +999: recovery may have rounded endTs down to the second
			break // older files are older still
		}
		var idx int32
		if f.slots != nil {
			idx = f.slots[slot]
		} else {
			var b [indexSlotSize]byte
			if _, err := f.f.ReadAt(b[:], x.slotPos(slot)); err != nil {
				return nil, 0, 0, x.readFailed(fmt.Errorf("read index file %s slot %d: %w", f.path, slot, err))
			}
			idx = int32(binary.BigEndian.Uint32(b[:]))
		}
		for idx > 0 && idx < h.count && len(offs) < maxQueryCandidates {
			e, err := x.entryAt(f, idx)
			if err != nil {
				return nil, 0, 0, err
			}
			// timeDiff is whole seconds: the message was stored in [t, t+999].
			t := h.beginTs + int64(e.timeDiff)*1000
			if t+999 < begin {
				break // the chain only gets older
			}
			if e.hash == hash && t <= end && !seen[e.phys] {
				seen[e.phys] = true
				offs = append(offs, e.phys)
			}
			if e.prev >= idx {
				break // a damaged link; chains always point back
			}
			idx = e.prev
		}
	}
	return offs, lastTs, lastPhy, nil
}

// QueryResult is what QueryMessages found.
type QueryResult struct {
	// Messages are copies of the stored messages, in commit-log order.
	Messages [][]byte
	// IndexLastUpdateTimestamp and IndexLastUpdatePhyOffset are the store timestamp and
	// commit-log offset of the last message the index holds (0 when it is empty).
	IndexLastUpdateTimestamp int64
	IndexLastUpdatePhyOffset int64
}

// QueryMessages looks messages of topic up by key, for QUERY_MESSAGE: with unique false,
// the messages whose KEYS property lists key; with unique true, the one whose UNIQ_KEY is
// key (the newest, should a producer have stored it twice). Only messages stored within
// [begin, end] (Unix ms, inclusive) are returned, at most maxNum (capped at
// MaxQueryMessages) and at most 8 MiB of them (at least one), the newest when more match.
//
// An empty key, maxNum < 1 (for a key query) or begin > end fails with ErrBadQuery, an
// invalid topic name with ErrBadTopic, a done ctx with its error. With Options.DisableIndex
// the result is always empty.
func (s *Store) QueryMessages(ctx context.Context, topic, key string, unique bool, maxNum int, begin, end int64) (*QueryResult, error) {
	switch {
	case !validTopic(topic):
		return nil, fmt.Errorf("query %q: %w", topic, ErrBadTopic)
	case key == "":
		return nil, fmt.Errorf("query %q: empty key: %w", topic, ErrBadQuery)
	case maxNum < 1 && !unique:
		return nil, fmt.Errorf("query %q: maxNum %d is below 1: %w", topic, maxNum, ErrBadQuery)
	case begin > end:
		return nil, fmt.Errorf("query %q: time range %d..%d runs backwards: %w", topic, begin, end, ErrBadQuery)
	}
	if s.isClosed() {
		return nil, ErrClosed
	}
	if unique {
		maxNum = 1
	}
	maxNum = min(maxNum, MaxQueryMessages)
	res := &QueryResult{}
	if s.index == nil {
		return res, nil
	}
	offs, lastTs, lastPhy, err := s.index.lookup(indexHash([]byte(topic), []byte(key)), begin, end)
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", topic, err)
	}
	res.IndexLastUpdateTimestamp, res.IndexLastUpdatePhyOffset = lastTs, lastPhy
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	slices.Sort(offs)
	slices.Reverse(offs) // newest first: they win when more match than maxNum
	total := 0
	for _, off := range offs {
		if len(res.Messages) >= maxNum {
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("query %q: %w", topic, err)
		}
		if dead.buried([]byte(topic), off) {
			continue // the topic was deleted since; this is the old topic's message
		}
		b, err := s.MessageAt(off)
		if errors.Is(err, ErrNotFound) {
			continue // removed by retention, or cut by recovery
		}
		if err != nil {
			return nil, fmt.Errorf("query %q: %w", topic, err)
		}
		if !matchesQuery(b, off, topic, key, unique, begin, end) {
			continue // a hash collision, or stored outside the range within its second
		}
		if len(res.Messages) > 0 && total+len(b) > maxQueryBytes {
			break
		}
		total += len(b)
		res.Messages = append(res.Messages, b)
	}
	slices.Reverse(res.Messages)
	return res, nil
}

// matchesQuery checks a stored message against a query exactly.
func matchesQuery(b []byte, off int64, topic, key string, unique bool, begin, end int64) bool {
	m, err := parseStored(b, off, false)
	if err != nil || string(m.topic) != topic || m.storeTs < begin || m.storeTs > end {
		return false
	}
	if unique {
		v, ok := protocol.FindProperty(m.props, protocol.PropertyUniqueKey)
		return ok && string(v) == key
	}
	keys, ok := protocol.FindProperty(m.props, protocol.PropertyKeys)
	if !ok {
		return false
	}
	for k := range bytes.FieldsSeq(keys) {
		if string(k) == key {
			return true
		}
	}
	return false
}

// ErrBadQuery: a key query without a key, with maxNum below 1, or with a time range that
// runs backwards.
var ErrBadQuery = errors.New("bad query")
