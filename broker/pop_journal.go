package broker

import (
	"container/heap"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/atomicfile"
)

// The pop journal keeps pop progress in <data>/pop: key (the receipt-handle MAC key),
// snapshot.json (every queue's progress at one point, with the journal generation after
// it) and journal-<gen>.log, the records since. Each record is
//
//	length(4) | crc32c(4) | kind(1) | body
//
// appended with one write(2) per operation and no fsync: the page cache keeps it through a
// kill -9 of the process (an operating-system crash may lose the last records, as it loses
// the store's unflushed messages). Replay stops at the first torn or corrupt record.
// When the journal passes popCompactBytes, the expiry loop writes a new snapshot and starts
// the next generation.
const popCompactBytes = 8 << 20

type recKind byte

const (
	recDefine recKind = 'Q' // a queue's journal id, start offset and key
	recPop    recKind = 'P' // an entry handed out (or its invisibility changed)
	recHold   recKind = 'H' // an entry read but held back (FIFO)
	recDone   recKind = 'A' // an entry acknowledged
	recDLQ    recKind = 'D' // an entry dead-lettered
	recForget recKind = 'F' // the queue's progress forgotten (its group was)
)

// popRecord is one journal record: offset for every kind, the rest for recPop and recHold.
type popRecord struct {
	kind     recKind
	q        *popQueue
	offset   int64
	attempt  int32
	epoch    uint64
	popTime  int64
	deadline int64
	msgGroup string
}

// entryRecord records e's state; the queue's lock is held. It copies fields, not the entry:
// the entry's heap index belongs to the timers' lock.
func entryRecord(kind recKind, q *popQueue, e *popEntry) popRecord {
	return popRecord{kind: kind, q: q, offset: e.offset, attempt: e.attempt, epoch: e.epoch, popTime: e.popTime, deadline: e.deadline, msgGroup: e.msgGroup}
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

type popJournal struct {
	dir string

	mu     sync.Mutex
	f      *os.File
	gen    uint64
	size   int64
	nextID uint32
	buf    []byte
	// full is signalled when the journal passes popCompactBytes, so that the expiry loop
	// compacts it however long its next deadline is.
	full chan struct{}
	// compactAt is popCompactBytes; tests lower it.
	compactAt int64
}

// define gives q a journal id and records it. Called with q not yet shared.
func (j *popJournal) define(q *popQueue) uint32 {
	j.mu.Lock()
	defer j.mu.Unlock()
	id := j.nextID
	j.nextID++
	b := j.frame(j.buf[:0], func(b []byte) []byte {
		b = append(b, byte(recDefine))
		b = binary.BigEndian.AppendUint32(b, id)
		b = binary.BigEndian.AppendUint64(b, uint64(q.start))
		b = append(b, boolByte(q.fifo))
		b = binary.BigEndian.AppendUint32(b, uint32(q.key.queueID))
		b = appendStr(b, q.key.group)
		return appendStr(b, q.key.topic)
	})
	j.buf = b
	_ = j.writeLocked(b) // a failed write fails the operation records that follow it
	return id
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// frame appends one framed record whose body body writes.
func (j *popJournal) frame(b []byte, body func([]byte) []byte) []byte {
	at := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = body(b)
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-8))
	binary.BigEndian.PutUint32(b[at+4:], crc32.Checksum(b[at+8:], crcTable))
	return b
}

// append writes recs in one write.
func (j *popJournal) append(recs []popRecord) error {
	if len(recs) == 0 {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	b := j.buf[:0]
	for i := range recs {
		r := &recs[i]
		b = j.frame(b, func(b []byte) []byte {
			b = append(b, byte(r.kind))
			b = binary.BigEndian.AppendUint32(b, r.q.jid)
			if r.kind == recForget {
				return b
			}
			if r.kind == recDone || r.kind == recDLQ {
				return binary.BigEndian.AppendUint64(b, uint64(r.offset))
			}
			b = binary.BigEndian.AppendUint64(b, uint64(r.offset))
			b = binary.BigEndian.AppendUint32(b, uint32(r.attempt))
			b = binary.BigEndian.AppendUint64(b, r.epoch)
			b = binary.BigEndian.AppendUint64(b, uint64(r.popTime))
			b = binary.BigEndian.AppendUint64(b, uint64(r.deadline))
			return appendStr(b, r.msgGroup)
		})
	}
	j.buf = b
	return j.writeLocked(b)
}

func (j *popJournal) writeLocked(b []byte) error {
	if j.f == nil {
		return errors.New("pop journal closed")
	}
	n, err := j.f.Write(b)
	j.size += int64(n)
	if j.size > j.compactAt {
		select {
		case j.full <- struct{}{}:
		default:
		}
	}
	if err != nil {
		return fmt.Errorf("append pop journal %s: %w", j.f.Name(), err)
	}
	return nil
}

func (j *popJournal) needsCompaction() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size > j.compactAt
}

func journalName(gen uint64) string { return "journal-" + strconv.FormatUint(gen, 10) + ".log" }

// popSnapshot is snapshot.json.
type popSnapshot struct {
	Gen    uint64         `json:"gen"`
	Epoch  uint64         `json:"epoch"`
	Queues []popSnapshotQ `json:"queues"`
}

type popSnapshotQ struct {
	ID      uint32         `json:"id"`
	Group   string         `json:"group"`
	Topic   string         `json:"topic"`
	QueueID int32          `json:"queueId"`
	FIFO    bool           `json:"fifo,omitempty"`
	Start   int64          `json:"start"`
	Next    int64          `json:"next"`
	Acked   uint64         `json:"acked"`
	DLQ     uint64         `json:"deadLettered"`
	Redeliv uint64         `json:"redelivered"`
	Entries []popSnapshotE `json:"entries,omitempty"`
}

type popSnapshotE struct {
	Offset   int64  `json:"o"`
	Attempt  int32  `json:"a"`
	Epoch    uint64 `json:"e"`
	PopTime  int64  `json:"p"`
	Deadline int64  `json:"d"`
	InFlight bool   `json:"f,omitempty"`
	MsgGroup string `json:"g,omitempty"`
	FirstPop int64  `json:"fp,omitempty"`
}

// compact writes a snapshot of every queue and moves to the next journal generation. The
// caller holds t.mu exclusively, so nothing changes meanwhile.
func (t *popTable) compact() error {
	j := t.jnl
	j.mu.Lock()
	defer j.mu.Unlock()
	gen := j.gen + 1
	nf, err := os.OpenFile(filepath.Join(j.dir, journalName(gen)), os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("create pop journal: %w", err)
	}
	snap := popSnapshot{Gen: gen, Epoch: t.epoch.Load()}
	var id uint32
	for _, q := range t.queues {
		sq := popSnapshotQ{ID: id, Group: q.key.group, Topic: q.key.topic, QueueID: q.key.queueID, FIFO: q.fifo,
			Start: q.start, Next: q.next, Acked: q.acked, DLQ: q.dlq, Redeliv: q.redeliv}
		for _, e := range q.entries {
			sq.Entries = append(sq.Entries, popSnapshotE{Offset: e.offset, Attempt: e.attempt, Epoch: e.epoch, PopTime: e.popTime, Deadline: e.deadline, InFlight: e.inflight, MsgGroup: e.msgGroup, FirstPop: e.firstPop})
		}
		snap.Queues = append(snap.Queues, sq)
		id++
	}
	data, err := json.Marshal(snap)
	if err == nil {
		err = atomicfile.WriteFile(filepath.Join(j.dir, "snapshot.json"), data, 0o644)
	}
	if err != nil {
		nf.Close()
		os.Remove(nf.Name())
		return fmt.Errorf("write pop snapshot: %w", err)
	}
	// The snapshot names the new generation: from here on, ids are the snapshot's.
	id = 0
	for _, sq := range snap.Queues {
		t.queues[popKey{sq.Group, sq.Topic, sq.QueueID}].jid = sq.ID
		id = max(id, sq.ID+1)
	}
	old := j.f
	j.f, j.gen, j.size, j.nextID = nf, gen, 0, id
	if old != nil {
		old.Close()
		os.Remove(old.Name())
	}
	return nil
}

// openPopTable loads <dir>'s pop state: the key (made on first use), the snapshot and the
// journal after it.
func openPopTable(dir string) (*popTable, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create pop directory: %w", err)
	}
	t := &popTable{queues: map[popKey]*popQueue{}, cursors: map[string]uint32{}, jnl: &popJournal{dir: dir, full: make(chan struct{}, 1), compactAt: popCompactBytes}}
	t.timers.kick = make(chan struct{}, 1)
	t.waiters.ch = map[string]chan struct{}{}
	key, err := loadPopKey(filepath.Join(dir, "key"))
	if err != nil {
		return nil, err
	}
	t.key = newHandleKey(key)
	var snap popSnapshot
	data, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read pop snapshot: %w", err)
	default:
		if err := json.Unmarshal(data, &snap); err != nil {
			return nil, fmt.Errorf("parse pop snapshot %s: %w", filepath.Join(dir, "snapshot.json"), err)
		}
	}
	byID := map[uint32]*popQueue{}
	maxEpoch := snap.Epoch
	for _, sq := range snap.Queues {
		q := newPopQueue(popKey{sq.Group, sq.Topic, sq.QueueID}, sq.Start, sq.FIFO)
		q.next, q.acked, q.dlq, q.redeliv, q.jid = sq.Next, sq.Acked, sq.DLQ, sq.Redeliv, sq.ID
		for _, se := range sq.Entries {
			q.entries[se.Offset] = &popEntry{q: q, offset: se.Offset, attempt: se.Attempt, epoch: se.Epoch, popTime: se.PopTime, deadline: se.Deadline, inflight: se.InFlight, msgGroup: se.MsgGroup, firstPop: se.FirstPop, hidx: -1}
			maxEpoch = max(maxEpoch, se.Epoch)
		}
		t.queues[q.key] = q
		byID[sq.ID] = q
		t.jnl.nextID = max(t.jnl.nextID, sq.ID+1)
	}
	t.jnl.gen = snap.Gen
	path := filepath.Join(dir, journalName(snap.Gen))
	ep, err := t.replay(path, byID)
	if err != nil {
		return nil, err
	}
	// Epochs go on from the highest the state names, and from the clock in microseconds:
	// the epochs of forgotten progress are not in the state, and a handle of theirs must not
	// match a new delivery of the same offset.
	t.epoch.Store(max(maxEpoch, ep, uint64(time.Now().UnixMicro())))
	if t.jnl.f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, fmt.Errorf("open pop journal: %w", err)
	}
	st, err := t.jnl.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat pop journal: %w", err)
	}
	t.jnl.size = st.Size()
	removeStaleJournals(dir, snap.Gen)
	for _, q := range t.queues {
		t.rebuild(q)
	}
	return t, nil
}

// rebuild derives a loaded queue's counts, visible list, FIFO order and timers from its
// entries.
func (t *popTable) rebuild(q *popQueue) {
	offs := slices.Sorted(maps.Keys(q.entries))
	for _, off := range offs {
		e := q.entries[off]
		q.next = max(q.next, off+1)
		if q.fifo && e.msgGroup != "" {
			q.groups[e.msgGroup] = append(q.groups[e.msgGroup], off)
		}
		if e.inflight {
			q.inflight++
			e.hdeadline = e.deadline
			heap.Push(&t.timers.h, e)
		} else {
			q.visible = append(q.visible, off)
		}
	}
	q.advance()
}

func removeStaleJournals(dir string, gen uint64) {
	names, _ := os.ReadDir(dir)
	for _, n := range names {
		if strings.HasPrefix(n.Name(), "journal-") && n.Name() != journalName(gen) {
			os.Remove(filepath.Join(dir, n.Name()))
		}
	}
}

func loadPopKey(path string) ([]byte, error) {
	key, err := os.ReadFile(path)
	if err == nil && len(key) == 32 {
		return key, nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read pop key: %w", err)
	}
	key = make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("make pop key: %w", err)
	}
	if err := atomicfile.WriteFile(path, key, 0o600); err != nil {
		return nil, fmt.Errorf("write pop key: %w", err)
	}
	return key, nil
}

// replay applies the journal at path, truncating it after its last whole record, and
// returns the highest epoch it names.
func (t *popTable) replay(path string, byID map[uint32]*popQueue) (uint64, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read pop journal: %w", err)
	}
	var maxEpoch uint64
	at := 0
	for at+8 <= len(data) {
		n := int(binary.BigEndian.Uint32(data[at:]))
		if n < 5 || at+8+n > len(data) || crc32.Checksum(data[at+8:at+8+n], crcTable) != binary.BigEndian.Uint32(data[at+4:]) {
			break
		}
		ep, ok := t.apply(data[at+8:at+8+n], byID)
		if !ok {
			break
		}
		maxEpoch = max(maxEpoch, ep)
		at += 8 + n
	}
	if at < len(data) {
		if err := os.Truncate(path, int64(at)); err != nil {
			return 0, fmt.Errorf("truncate pop journal after its last whole record: %w", err)
		}
	}
	return maxEpoch, nil
}

// apply applies one record body; ok false for one that does not parse.
func (t *popTable) apply(b []byte, byID map[uint32]*popQueue) (epoch uint64, ok bool) {
	r := reader{b: b[5:]}
	kind, id := recKind(b[0]), binary.BigEndian.Uint32(b[1:])
	if kind == recDefine {
		start := int64(r.u64())
		fifo := r.byte() == 1
		qid := int32(r.u32())
		group, topic := r.str(), r.str()
		if r.bad {
			return 0, false
		}
		key := popKey{group, topic, qid}
		q := t.queues[key]
		if q == nil {
			q = newPopQueue(key, start, fifo)
			t.queues[key] = q
		}
		q.jid = id
		byID[id] = q
		t.jnl.nextID = max(t.jnl.nextID, id+1)
		return 0, true
	}
	q := byID[id]
	if q == nil {
		return 0, false
	}
	if kind == recForget {
		delete(t.queues, q.key)
		delete(byID, id)
		return 0, true
	}
	off := int64(r.u64())
	switch kind {
	case recDone, recDLQ:
		if r.bad {
			return 0, false
		}
		delete(q.entries, off)
		q.next = max(q.next, off+1)
		if kind == recDone {
			q.acked++
		} else {
			q.dlq++
		}
		return 0, true
	case recPop, recHold:
		e := &popEntry{q: q, offset: off, attempt: int32(r.u32()), epoch: r.u64(), popTime: int64(r.u64()), deadline: int64(r.u64()), msgGroup: r.str(), hidx: -1}
		if r.bad {
			return 0, false
		}
		e.inflight = kind == recPop
		switch old := q.entries[off]; {
		case e.attempt == 1:
			e.firstPop = e.popTime
		case old != nil:
			e.firstPop = old.firstPop
		}
		q.entries[off] = e
		q.next = max(q.next, off+1)
		return e.epoch, true
	}
	return 0, false
}

// reader reads big-endian fields, noting a short body in bad.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || len(r.b) < n {
		r.bad = true
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *reader) byte() byte  { return r.take(1)[0] }
func (r *reader) u32() uint32 { return binary.BigEndian.Uint32(r.take(4)) }
func (r *reader) u64() uint64 { return binary.BigEndian.Uint64(r.take(8)) }
func (r *reader) str() string { return string(r.take(int(binary.BigEndian.Uint16(r.take(2))))) }

func (j *popJournal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}
