package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// The key index is RocketMQ's IndexService: it maps "topic#key" to the commit-log offsets of
// the messages carrying that key, for every key of a message's KEYS property (space
// separated) and for its UNIQ_KEY.
//
// # File layout (RocketMQ's, big-endian)
//
//	header   40 bytes: beginTimestamp 8, endTimestamp 8, beginPhyOffset 8, endPhyOffset 8,
//	         hashSlotCount 4 (slots in use), indexCount 4 (next entry index; entry 0 is never
//	         used, so a file holds IndexEntries-1 entries)
//	slots    IndexSlots × 4 bytes: the index of the newest entry whose key hash falls in the
//	         slot, 0 for none
//	entries  IndexEntries × 20 bytes: keyHash 4, commitLogOffset 8, timeDiff 4 (seconds
//	         since beginTimestamp), prevIndex 4 (the slot's previous entry, 0 for none)
//
// Files are named after the commit-log offset of their first message and live in
// <dir>/index/. Entries are appended in commit-log order, so within a file and across files
// commit-log offsets never decrease.
//
// # Durability
//
// The entries are written with one pwrite per dispatch batch; the header with a file's first
// entries and then when the index is synced (and when a file is sealed or the store closes). The slot
// table of the active file lives in memory (IndexSlots × 4 bytes, 20 MB by default, where
// RocketMQ maps the whole file) and is written out when the file fills up and at Close. The
// store's checkpoint fsyncs the active file and then records in <dir>/index/checkpoint how
// many of its entries are durable, before it writes its own record, so that "the consume
// queues are durable below X" also holds for the index. After a crash, Open cuts the active
// file back to that count, then to the re-dispatch point (recovery re-indexes what follows)
// and to the recovered end of the log, and rebuilds the slot table from the entries kept.
//
// # Reads
//
// A lookup walks a slot's chain from the newest file to the oldest, collects the entries
// whose hash and time match, and then re-reads each message to check its topic, key and
// store time exactly: hash collisions, the second granularity of timeDiff, and entries whose
// message was deleted by retention or belongs to a deleted topic never reach a caller.

const (
	indexHeaderSize = 40
	indexSlotSize   = 4
	indexEntrySize  = 20
	indexDirName    = "index"
	indexCPName     = "checkpoint"

	defaultIndexSlots   = 5_000_000
	defaultIndexEntries = 20_000_000

	// MaxQueryMessages bounds the messages one query returns (RocketMQ's maxMsgsNumBatch).
	MaxQueryMessages = 64
	// maxQueryBytes bounds a query result's bytes (at least one message is returned), so that
	// a response fits a frame.
	maxQueryBytes = 8 << 20
	// maxQueryCandidates bounds the index entries one query collects, so that a key shared
	// by millions of messages (or a hash slot they crowd) costs a bounded amount of reading.
	maxQueryCandidates = 4096
)

type indexHeader struct {
	beginTs, endTs   int64
	beginPhy, endPhy int64
	slotsUsed        int32
	count            int32 // next entry index; 1 when empty
}

func (h *indexHeader) encode(b []byte) {
	binary.BigEndian.PutUint64(b[0:], uint64(h.beginTs))
	binary.BigEndian.PutUint64(b[8:], uint64(h.endTs))
	binary.BigEndian.PutUint64(b[16:], uint64(h.beginPhy))
	binary.BigEndian.PutUint64(b[24:], uint64(h.endPhy))
	binary.BigEndian.PutUint32(b[32:], uint32(h.slotsUsed))
	binary.BigEndian.PutUint32(b[36:], uint32(h.count))
}

func decodeIndexHeader(b []byte) indexHeader {
	return indexHeader{
		beginTs:   int64(binary.BigEndian.Uint64(b[0:])),
		endTs:     int64(binary.BigEndian.Uint64(b[8:])),
		beginPhy:  int64(binary.BigEndian.Uint64(b[16:])),
		endPhy:    int64(binary.BigEndian.Uint64(b[24:])),
		slotsUsed: int32(binary.BigEndian.Uint32(b[32:])),
		count:     int32(binary.BigEndian.Uint32(b[36:])),
	}
}

type indexEntry struct {
	hash     int32
	phys     int64
	timeDiff int32
	prev     int32
}

func decodeIndexEntry(b []byte) indexEntry {
	return indexEntry{
		hash:     int32(binary.BigEndian.Uint32(b)),
		phys:     int64(binary.BigEndian.Uint64(b[4:])),
		timeDiff: int32(binary.BigEndian.Uint32(b[12:])),
		prev:     int32(binary.BigEndian.Uint32(b[16:])),
	}
}

func appendIndexEntry(b []byte, e indexEntry) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(e.hash))
	b = binary.BigEndian.AppendUint64(b, uint64(e.phys))
	b = binary.BigEndian.AppendUint32(b, uint32(e.timeDiff))
	return binary.BigEndian.AppendUint32(b, uint32(e.prev))
}

// indexFile is one index file. hdr and slots are guarded by keyIndex.mu.
type indexFile struct {
	start int64 // from the name: the commit-log offset of its first message
	path  string
	f     vfs.File
	hdr   indexHeader
	// slots is the slot table while the file is active; nil once it is sealed (full, its
	// table written to the file).
	slots []int32
	// dirty marks the chunks of slotChunk slots that differ from the file, so that writing
	// the table out (at Close, or when the file fills) writes only what changed.
	dirty []bool
}

// slotChunk is the granularity of slot-table write-out: 64 KiB of slots.
const slotChunk = 16 << 10

func (f *indexFile) setSlot(slot, v int32) {
	f.slots[slot] = v
	f.dirty[slot/slotChunk] = true
}

func (f *indexFile) newSlots(n int32, dirty bool) {
	f.slots = make([]int32, n)
	f.dirty = make([]bool, (int(n)+slotChunk-1)/slotChunk)
	for i := range f.dirty {
		f.dirty[i] = dirty
	}
}

// pendingKey is one key of a dispatched message, waiting for the batch's commit.
type pendingKey struct {
	hash int32
	phys int64
	ts   int64
}

// keyIndex is the store's key index. The dispatcher (one goroutine, or recovery before it
// starts) adds and commits; lookups, the checkpoint and retention run concurrently.
//
// Lock order: syncMu, then mu. Store.cpMu (checkpoint) is taken before both.
type keyIndex struct {
	fs      vfs.FS
	dir     string
	slots   int32
	entries int32

	// Dispatcher-only state.
	pend     []pendingKey
	buf      []byte
	lastPhys int64 // commit-log offset of the last message indexed; -1 for none

	syncMu sync.Mutex // serializes sync (fsync + checkpoint record) with retention's deletions
	cp     vfs.File   // under syncMu

	mu     sync.RWMutex
	files  []*indexFile // ascending; the last may be active
	synced struct {     // what the index checkpoint says, under syncMu
		start int64
		count int32
	}

	readErrs *atomic.Int64 // the store's count of failed reads (Stats.ReadErrors)
}

func (x *keyIndex) fileSize() int64 {
	return indexHeaderSize + int64(x.slots)*indexSlotSize + int64(x.entries)*indexEntrySize
}

func (x *keyIndex) slotPos(slot int32) int64 {
	return indexHeaderSize + int64(slot)*indexSlotSize
}

func (x *keyIndex) entryPos(i int32) int64 {
	return indexHeaderSize + int64(x.slots)*indexSlotSize + int64(i)*indexEntrySize
}

// indexHash is RocketMQ's indexKeyHashMethod: Math.abs of Java's String.hashCode of
// "topic#key", 0 for Integer.MIN_VALUE.
func indexHash(topic, key []byte) int32 {
	var h int32
	ascii := true
	for _, part := range [][]byte{topic, {'#'}, key} {
		for _, c := range part {
			if c >= 0x80 {
				ascii = false
				break
			}
			h = 31*h + int32(c)
		}
	}
	if !ascii {
		h = int32(protocol.TagsCode(string(topic) + "#" + string(key)))
	}
	if h < 0 {
		h = -h
	}
	if h < 0 {
		h = 0
	}
	return h
}

// indexCheckpoint is the record of <dir>/index/checkpoint: the active file and how many of
// its entries (the count, entry 0 included) an fsync covered.
const (
	indexCPMagic = 0x464C5744_49445831 // "FLWDIDX1"
	indexCPSize  = 8 + 8 + 4 + 4
)

func encodeIndexCP(start int64, count int32) []byte {
	b := make([]byte, 0, indexCPSize)
	b = binary.BigEndian.AppendUint64(b, indexCPMagic)
	b = binary.BigEndian.AppendUint64(b, uint64(start))
	b = binary.BigEndian.AppendUint32(b, uint32(count))
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func decodeIndexCP(b []byte) (start int64, count int32, ok bool) {
	if len(b) < indexCPSize || binary.BigEndian.Uint64(b) != indexCPMagic ||
		crc32.ChecksumIEEE(b[:indexCPSize-4]) != binary.BigEndian.Uint32(b[indexCPSize-4:]) {
		return 0, 0, false
	}
	return int64(binary.BigEndian.Uint64(b[8:])), int32(binary.BigEndian.Uint32(b[16:])), true
}

// openIndex loads the index files in <dir>/index. After a crash (or without a checkpoint of
// its own) it keeps only what the index checkpoint says was fsynced; the caller then cuts
// it to the re-dispatch point and the recovered end with truncate.
func openIndex(s *Store, crash bool) (*keyIndex, error) {
	x := &keyIndex{
		fs: s.fs, dir: filepath.Join(s.dir, indexDirName),
		slots: int32(s.opts.IndexSlots), entries: int32(s.opts.IndexEntries), lastPhys: -1,
		readErrs: &s.readErrors,
	}
	if err := x.fs.MkdirAll(x.dir, 0o755); err != nil {
		return nil, fmt.Errorf("open index: %w", err)
	}
	cp, err := x.fs.OpenFile(filepath.Join(x.dir, indexCPName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open index checkpoint: %w", err)
	}
	x.cp = cp
	b := make([]byte, indexCPSize)
	// Read short, the checkpoint would count as missing, and a crash recovery would then
	// remove every index file.
	n, err := readHead(cp, b)
	if err != nil {
		x.close()
		return nil, x.readFailed(fmt.Errorf("read index checkpoint %s: %w", filepath.Join(x.dir, indexCPName), err))
	}
	cpStart, cpCount, cpOK := decodeIndexCP(b[:n])
	ents, err := x.fs.ReadDir(x.dir)
	if err != nil {
		x.close()
		return nil, fmt.Errorf("list index: %w", err)
	}
	for _, e := range ents {
		start, ok := parseOffsetName(e.Name())
		if !ok || e.IsDir() {
			if e.Name() != indexCPName {
				s.log.Warn("ignoring unexpected file in index", "name", e.Name())
			}
			continue
		}
		path := filepath.Join(x.dir, e.Name())
		if crash && (!cpOK || start > cpStart || (start == cpStart && cpCount <= 1)) {
			// No entry of it is covered by an index checkpoint: nothing in it is known
			// durable, not even its size.
			if err := x.fs.Remove(path); err != nil {
				x.close()
				return nil, fmt.Errorf("remove index file %s: %w", path, err)
			}
			continue
		}
		fi, err := x.fs.Stat(path)
		if err != nil {
			x.close()
			return nil, fmt.Errorf("stat index file %s: %w", path, err)
		}
		if fi.Size() != x.fileSize() {
			// IndexSlots or IndexEntries changed: the file cannot be read with these sizes.
			// The index is derived data, so it goes rather than keeping the store closed;
			// its messages can no longer be looked up by key.
			s.log.Warn("removing index file of another size (were IndexSlots or IndexEntries changed?)",
				"file", path, "size", fi.Size(), "expected", x.fileSize())
			if err := x.fs.Remove(path); err != nil {
				x.close()
				return nil, fmt.Errorf("remove index file %s: %w", path, err)
			}
			continue
		}
		f, err := x.fs.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			x.close()
			return nil, fmt.Errorf("open index file %s: %w", path, err)
		}
		xf := &indexFile{start: start, path: path, f: f}
		x.files = append(x.files, xf)
		var hb [indexHeaderSize]byte
		if _, err := f.ReadAt(hb[:], 0); err != nil {
			x.close()
			return nil, x.readFailed(fmt.Errorf("read index file %s header: %w", path, err))
		}
		xf.hdr = decodeIndexHeader(hb[:])
		if crash && start == cpStart {
			xf.hdr.count = min(xf.hdr.count, cpCount)
		}
		if xf.hdr.count < 1 || xf.hdr.count > x.entries {
			x.close()
			return nil, fmt.Errorf("index file %s has entry count %d of %d: %w", path, xf.hdr.count, x.entries, ErrCorrupt)
		}
	}
	if cpOK {
		x.synced.start, x.synced.count = cpStart, cpCount
	}
	if err := x.dropEmptyTail(); err != nil {
		x.close()
		return nil, err
	}
	if len(x.files) > 0 {
		last := x.files[len(x.files)-1]
		if err := x.activate(last, crash); err != nil {
			x.close()
			return nil, err
		}
		x.lastPhys = last.hdr.endPhy
	}
	return x, nil
}

// dropEmptyTail removes trailing files without entries.
func (x *keyIndex) dropEmptyTail() error {
	for len(x.files) > 0 {
		last := x.files[len(x.files)-1]
		if last.hdr.count > 1 {
			return nil
		}
		last.f.Close()
		if err := x.fs.Remove(last.path); err != nil {
			return fmt.Errorf("remove index file %s: %w", last.path, err)
		}
		x.files = x.files[:len(x.files)-1]
	}
	return nil
}

// activate gives the last file its in-memory slot table unless it is full: read from the
// file when it was written there (clean stop), rebuilt from the entries otherwise.
func (x *keyIndex) activate(f *indexFile, rebuild bool) error {
	if f.hdr.count >= x.entries {
		f.slots, f.dirty = nil, nil
		return nil
	}
	// A rebuilt table differs from the file's wherever that one is stale.
	f.newSlots(x.slots, rebuild)
	if !rebuild {
		b := make([]byte, 1<<20)
		for i := int32(0); i < x.slots; {
			n := min(int(x.slots-i), len(b)/indexSlotSize)
			if _, err := f.f.ReadAt(b[:n*indexSlotSize], x.slotPos(i)); err != nil {
				return x.readFailed(fmt.Errorf("read index slots %s: %w", f.path, err))
			}
			for j := range n {
				v := int32(binary.BigEndian.Uint32(b[j*indexSlotSize:]))
				if v < 0 || v >= f.hdr.count {
					v = 0 // points past the entries kept
					f.dirty[(int(i)+j)/slotChunk] = true
				}
				f.slots[int(i)+j] = v
			}
			i += int32(n)
		}
		return nil
	}
	// Rebuild from the entries: each entry's slot points at the newest entry of its hash.
	used := int32(0)
	b := make([]byte, 64<<10)
	for i := int32(1); i < f.hdr.count; {
		n := min(int(f.hdr.count-i), len(b)/indexEntrySize)
		if _, err := f.f.ReadAt(b[:n*indexEntrySize], x.entryPos(i)); err != nil {
			return x.readFailed(fmt.Errorf("read index entries %s: %w", f.path, err))
		}
		for j := range n {
			e := decodeIndexEntry(b[j*indexEntrySize:])
			slot := e.hash % x.slots
			if e.hash < 0 {
				slot = 0
			}
			if f.slots[slot] == 0 {
				used++
			}
			f.slots[slot] = i + int32(j) // every chunk is dirty already
		}
		i += int32(n)
	}
	f.hdr.slotsUsed = used
	return nil
}

// entryAt reads entry i of f.
func (x *keyIndex) entryAt(f *indexFile, i int32) (indexEntry, error) {
	var b [indexEntrySize]byte
	if _, err := f.f.ReadAt(b[:], x.entryPos(i)); err != nil {
		return indexEntry{}, x.readFailed(fmt.Errorf("read index file %s entry %d: %w", f.path, i, err))
	}
	return decodeIndexEntry(b[:]), nil
}

// readFailed is readFailure for the index's reads.
func (x *keyIndex) readFailed(err error) error { return readFailure(x.readErrs, err) }

// truncate removes every entry of a message at or after commit-log offset off (recovery
// re-indexes what it re-dispatches; the log may have lost its tail), rebuilds the last
// file's slot table if it lost entries, and makes the result durable. It runs in Open.
func (x *keyIndex) truncate(off int64) error {
	if x == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	changed := false
	for len(x.files) > 0 {
		last := x.files[len(x.files)-1]
		if last.hdr.endPhy < off || last.hdr.count <= 1 {
			break
		}
		// Entries are in commit-log order: find the first at or after off.
		lo, hi := int32(1), last.hdr.count
		for lo < hi {
			mid := lo + (hi-lo)/2
			e, err := x.entryAt(last, mid)
			if err != nil {
				return err
			}
			if e.phys >= off {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		changed = true
		if lo <= 1 {
			last.f.Close()
			if err := x.fs.Remove(last.path); err != nil {
				return fmt.Errorf("remove index file %s: %w", last.path, err)
			}
			x.files = x.files[:len(x.files)-1]
			continue
		}
		e, err := x.entryAt(last, lo-1)
		if err != nil {
			return err
		}
		last.hdr.count = lo
		last.hdr.endPhy = e.phys
		last.hdr.endTs = last.hdr.beginTs + int64(e.timeDiff)*1000
		if err := x.activate(last, true); err != nil {
			return err
		}
		break
	}
	x.lastPhys = -1
	if n := len(x.files); n > 0 {
		x.lastPhys = x.files[n-1].hdr.endPhy
	}
	if !changed {
		return nil
	}
	if n := len(x.files); n > 0 {
		last := x.files[n-1]
		if last.slots == nil { // it was sealed and lost entries: active again
			if err := x.activate(last, true); err != nil {
				return err
			}
		}
		if err := x.writeHeader(last); err != nil {
			return err
		}
	}
	// The cut must be durable before anything overwrites the entries it removed: the
	// checkpoint must never cover an entry that is not the one written after it.
	x.mu.Unlock()
	err := x.sync()
	x.mu.Lock()
	return err
}

func (x *keyIndex) writeHeader(f *indexFile) error {
	var hb [indexHeaderSize]byte
	f.hdr.encode(hb[:])
	if _, err := f.f.WriteAt(hb[:], 0); err != nil {
		return fmt.Errorf("write index header %s: %w", f.path, err)
	}
	return nil
}

// add queues the keys of one dispatched message. A message at or below the last one
// indexed is skipped: recovery re-dispatches from its checkpoint, which may lie below what
// the index already holds.
func (x *keyIndex) add(m *msgInfo) {
	if x == nil || m.phys <= x.lastPhys {
		return
	}
	x.lastPhys = m.phys
	if uniq, ok := protocol.FindProperty(m.props, protocol.PropertyUniqueKey); ok && len(uniq) > 0 {
		x.pend = append(x.pend, pendingKey{hash: indexHash(m.topic, uniq), phys: m.phys, ts: m.storeTs})
	}
	if keys, ok := protocol.FindProperty(m.props, protocol.PropertyKeys); ok {
		for k := range bytes.FieldsSeq(keys) {
			x.pend = append(x.pend, pendingKey{hash: indexHash(m.topic, k), phys: m.phys, ts: m.storeTs})
		}
	}
}

// commit writes the queued keys, with one write per file. Lookups see them once it returns.
func (x *keyIndex) commit() error {
	if x == nil || len(x.pend) == 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	pend := x.pend
	x.pend = x.pend[:0]
	for len(pend) > 0 {
		f, err := x.activeFile(pend[0].phys)
		if err != nil {
			return err
		}
		first := f.hdr.count
		buf := x.buf[:0]
		for len(pend) > 0 && f.hdr.count < x.entries {
			k := pend[0]
			pend = pend[1:]
			if f.hdr.count == 1 {
				f.hdr.beginTs, f.hdr.beginPhy = k.ts, k.phys
			}
			slot := k.hash % x.slots
			prev := f.slots[slot]
			if prev == 0 {
				f.hdr.slotsUsed++
			}
			diff := (k.ts - f.hdr.beginTs) / 1000
			diff = max(0, min(diff, 1<<31-1))
			buf = appendIndexEntry(buf, indexEntry{hash: k.hash, phys: k.phys, timeDiff: int32(diff), prev: prev})
			f.setSlot(slot, f.hdr.count)
			f.hdr.count++
			f.hdr.endTs, f.hdr.endPhy = k.ts, k.phys
		}
		x.buf = buf
		if _, err := f.f.WriteAt(buf, x.entryPos(first)); err != nil {
			return fmt.Errorf("write index file %s: %w", f.path, err)
		}
		// The header is written here only with a file's first entries (its begin time,
		// which every entry's time is relative to): lookups use the in-memory one, and the
		// file's copy matters only to Open, which gets it from sync, seal or writeOut (see
		// sync).
		if first == 1 {
			if err := x.writeHeader(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// activeFile returns the file to append to, sealing a full one and creating the next
// (named after phys, the first message it will hold). Called with mu held.
func (x *keyIndex) activeFile(phys int64) (*indexFile, error) {
	if n := len(x.files); n > 0 {
		last := x.files[n-1]
		if last.hdr.count < x.entries {
			return last, nil
		}
		if last.slots != nil {
			if err := x.seal(last); err != nil {
				return nil, err
			}
		}
	}
	// Named after its first message, unless a message with more keys than a file holds
	// already gave a file that name.
	name := phys
	if n := len(x.files); n > 0 {
		name = max(name, x.files[n-1].start+1)
	}
	path := filepath.Join(x.dir, offsetName(name))
	f, err := x.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create index file %s: %w", path, err)
	}
	if err := f.Truncate(x.fileSize()); err != nil {
		f.Close()
		return nil, fmt.Errorf("size index file %s: %w", path, err)
	}
	if err := x.fs.SyncDir(x.dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync %s: %w", x.dir, err)
	}
	xf := &indexFile{start: name, path: path, f: f, hdr: indexHeader{count: 1}}
	xf.newSlots(x.slots, false)
	x.files = append(x.files, xf)
	return xf, nil
}

// seal writes a file's slot table and header and fsyncs it: from then on lookups read its
// slots from the file. Called with mu held.
func (x *keyIndex) seal(f *indexFile) error {
	if err := x.writeSlots(f); err != nil {
		return err
	}
	if err := f.f.Sync(); err != nil {
		return fmt.Errorf("fsync index file %s: %w", f.path, err)
	}
	f.slots, f.dirty = nil, nil
	return nil
}

// writeSlots writes the chunks of the slot table that changed, and the header.
func (x *keyIndex) writeSlots(f *indexFile) error {
	b := make([]byte, 0, slotChunk*indexSlotSize)
	for c, d := range f.dirty {
		if !d {
			continue
		}
		lo := c * slotChunk
		hi := min(lo+slotChunk, len(f.slots))
		b = b[:0]
		for _, v := range f.slots[lo:hi] {
			b = binary.BigEndian.AppendUint32(b, uint32(v))
		}
		if _, err := f.f.WriteAt(b, x.slotPos(int32(lo))); err != nil {
			return fmt.Errorf("write index slots %s: %w", f.path, err)
		}
		f.dirty[c] = false
	}
	return x.writeHeader(f)
}

// sync makes every committed entry durable and records so in the index checkpoint. The
// store's checkpoint calls it before writing its own record.
func (x *keyIndex) sync() error {
	if x == nil {
		return nil
	}
	x.syncMu.Lock()
	defer x.syncMu.Unlock()
	x.mu.Lock()
	var f *indexFile
	var count int32
	if n := len(x.files); n > 0 {
		f = x.files[n-1]
		count = f.hdr.count
	}
	var start int64
	if f != nil {
		start = f.start
		if start == x.synced.start && count == x.synced.count {
			x.mu.Unlock()
			return nil
		}
		// The header goes to the file here, not with every commit: the dispatcher then
		// writes one range per batch instead of two. It precedes the fsync and the
		// checkpoint record, so the file's count is never below the checkpoint's, which is
		// all a crash recovery reads it for (it keeps min(header, checkpoint) entries).
		if err := x.writeHeader(f); err != nil {
			x.mu.Unlock()
			return err
		}
	}
	x.mu.Unlock()
	if f != nil {
		// Files before the last were fsynced when they were sealed.
		if err := f.f.Sync(); err != nil {
			return fmt.Errorf("fsync index file %s: %w", f.path, err)
		}
	} else if x.synced.count == 0 && x.synced.start == 0 {
		return nil
	}
	if _, err := x.cp.WriteAt(encodeIndexCP(start, count), 0); err != nil {
		return fmt.Errorf("write index checkpoint: %w", err)
	}
	if err := x.cp.Sync(); err != nil {
		return fmt.Errorf("fsync index checkpoint: %w", err)
	}
	x.synced.start, x.synced.count = start, count
	return nil
}

// deleteBelow removes the files (never the last) whose every message lies below the
// commit log's min offset.
func (x *keyIndex) deleteBelow(minOffset int64) error {
	if x == nil {
		return nil
	}
	x.syncMu.Lock()
	defer x.syncMu.Unlock()
	x.mu.Lock()
	var del []*indexFile
	for len(x.files) > 1 && x.files[0].hdr.endPhy < minOffset {
		del = append(del, x.files[0])
		x.files = x.files[1:]
	}
	x.mu.Unlock()
	if len(del) == 0 {
		return nil
	}
	for _, f := range del {
		f.f.Close()
		if err := x.fs.Remove(f.path); err != nil {
			return fmt.Errorf("remove index file %s: %w", f.path, err)
		}
	}
	if err := x.fs.SyncDir(x.dir); err != nil {
		return fmt.Errorf("sync %s: %w", x.dir, err)
	}
	return nil
}

// writeOut writes the active file's slot table and fsyncs it, at a clean Close, so that the
// next Open reads the table instead of rebuilding it from the entries. The store removes its
// abort marker (which makes the next Open trust the table) only after this succeeded.
func (x *keyIndex) writeOut() error {
	if x == nil {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	n := len(x.files)
	if n == 0 || x.files[n-1].slots == nil {
		return nil
	}
	last := x.files[n-1]
	if err := x.writeSlots(last); err != nil {
		return err
	}
	if err := last.f.Sync(); err != nil {
		return fmt.Errorf("fsync index file %s: %w", last.path, err)
	}
	return nil
}

// close closes every file.
func (x *keyIndex) close() error {
	if x == nil {
		return nil
	}
	x.syncMu.Lock()
	defer x.syncMu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	var errs []error
	for _, f := range x.files {
		if err := f.f.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	x.files = nil
	if x.cp != nil {
		errs = append(errs, x.cp.Close())
		x.cp = nil
	}
	return errors.Join(errs...)
}
