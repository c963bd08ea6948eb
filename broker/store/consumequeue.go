package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
)

// cqUnitSize is the size of one consume-queue unit: int64 commit-log offset, int32 size,
// int64 tags code, big-endian.
const cqUnitSize = 20

// consumeQueue is the index of one (topic, queue id): unit i describes the message with
// logical (queue) offset i. Units live in files of Options.ConsumeQueueUnits units, named
// RocketMQ-style by their first unit's byte position (first unit index × 20), padded to 20
// digits.
//
// Only the dispatcher (and recovery, before it starts) writes units. max is published after
// the units below it are written, so a reader that sees max never reads a unit being written.
type consumeQueue struct {
	topic string
	qid   int32
	dir   string
	units int64 // units per file

	mu    sync.RWMutex
	files []*cqFile // ascending by start; retention removes from the front

	min atomic.Int64 // first readable unit (may be inside files[0])
	max atomic.Int64 // exclusive

	// mapped is the one file of the queue the dispatcher has mapped (mapCQFile); only the
	// dispatcher uses it.
	mapped *cqFile

	readErrs *atomic.Int64 // the store's count of failed reads (Stats.ReadErrors)
}

type cqFile struct {
	start int64 // first unit index
	path  string
	f     vfs.File
	dirty atomic.Bool // written since the last checkpoint fsync

	// mapTried is set once the dispatcher tried to map the file (only it writes units).
	mapTried bool
	// mmu guards m against close: units are copied into m under it.
	mmu       sync.Mutex
	m         []byte        // the whole file mapped shared and writable, or nil: units go by pwrite
	maps      *atomic.Int64 // with m: the store's count of mapped files (Store.cqMaps)
	populated int64         // m is populated writable from the first write's step up to here
}

// cqPopulateStep is how much of a mapped consume-queue file write populates at once,
// ahead of the units it copies (3276 units).
const cqPopulateStep = 64 << 10

// write stores b at byte offset off of the file: a copy into its mapping when it has one.
//
// # Notes
//
// The mapping is populated writable (MADV_POPULATE_WRITE) a step at a time ahead of the
// copy: a copy that faulted each fresh page of the sparse file in by itself spent more
// on the faults (about 80 % of the copy's samples in a flowd bench profile) than the
// pwrite it replaced; populated in 64 KiB steps, the kernel's cost is little more than
// zeroing the pages.
func (f *cqFile) write(b []byte, off int64) error {
	f.mmu.Lock()
	defer f.mmu.Unlock()
	if f.m == nil {
		_, err := f.f.WriteAt(b, off)
		return err
	}
	if end := off + int64(len(b)); end > f.populated {
		from := max(f.populated, off-off%cqPopulateStep) // never the units below the first write
		to := min(int64(len(f.m)), (end+cqPopulateStep-1)/cqPopulateStep*cqPopulateStep)
		_ = prefault(f.m[from:to]) // an optimization: on error the copy faults the pages in
		f.populated = to
	}
	return guardedCopy(f.m[off:off+int64(len(b))], b)
}

// unmap drops the file's mapping; later writes to it use pwrite.
func (f *cqFile) unmap() {
	f.mmu.Lock()
	defer f.mmu.Unlock()
	if f.m != nil {
		_ = unmapSegment(f.m) // only fails for a bad range, which m is not
		f.m = nil
		f.maps.Add(-1)
	}
}

// close unmaps and closes the file. A mapped file is full size, zeros after its last unit;
// if used is not negative, it is first cut back to used bytes, so that a clean reopen finds
// exactly the units written.
func (f *cqFile) close(used int64) error {
	f.mmu.Lock()
	var errs []error
	if f.m != nil {
		errs = append(errs, unmapSegment(f.m))
		f.m = nil
		f.maps.Add(-1)
		if used >= 0 {
			errs = append(errs, f.f.Truncate(used))
		}
	}
	f.mmu.Unlock()
	errs = append(errs, f.f.Close())
	return errors.Join(errs...)
}

func (s *Store) cqDir(topic string, qid int32) string {
	return filepath.Join(s.cqRoot, topic, strconv.Itoa(int(qid)))
}

// queue returns the consume queue of (topic, qid), or nil.
func (s *Store) queue(topic string, qid int32) *consumeQueue {
	s.cqMu.RLock()
	q := s.cqs[topic][qid]
	s.cqMu.RUnlock()
	return q
}

// queueBytes is queue for a topic still in a byte slice; the map lookup does not allocate.
func (s *Store) queueBytes(topic []byte, qid int32) *consumeQueue {
	s.cqMu.RLock()
	q := s.cqs[string(topic)][qid]
	s.cqMu.RUnlock()
	return q
}

// queueOrCreate returns the consume queue of (topic, qid), registering a new empty one.
func (s *Store) queueOrCreate(topic []byte, qid int32) (*consumeQueue, error) {
	if q := s.queueBytes(topic, qid); q != nil {
		return q, nil
	}
	t := string(topic)
	if !validTopic(t) || qid < 0 {
		return nil, fmt.Errorf("dispatch to %q queue %d: %w", t, qid, ErrBadTopic)
	}
	s.cqMu.Lock()
	defer s.cqMu.Unlock()
	qs := s.cqs[t]
	if qs == nil {
		qs = make(map[int32]*consumeQueue)
		s.cqs[t] = qs
	}
	if q := qs[qid]; q != nil {
		return q, nil
	}
	q := &consumeQueue{topic: t, qid: qid, dir: s.cqDir(t, qid), units: int64(s.opts.ConsumeQueueUnits), readErrs: &s.readErrors}
	qs[qid] = q
	return q, nil
}

// fileFor returns the file holding unit idx, or nil.
func (q *consumeQueue) fileFor(idx int64) *cqFile {
	q.mu.RLock()
	defer q.mu.RUnlock()
	return q.fileForLocked(idx)
}

func (q *consumeQueue) fileForLocked(idx int64) *cqFile {
	i, ok := slices.BinarySearchFunc(q.files, idx, func(f *cqFile, idx int64) int {
		switch {
		case idx < f.start:
			return 1
		case idx >= f.start+q.units:
			return -1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return q.files[i]
}

// write stores units (a whole number of 20-byte units) starting at unit index idx, creating
// files as needed, and raises max. Writing below max overwrites, which is what makes
// recovery's re-dispatch idempotent.
func (s *Store) writeUnits(q *consumeQueue, idx int64, units []byte) error {
	if q.max.Load() == 0 && idx > 0 {
		// An empty queue whose first unit is not 0 (its older files were lost, or its topic
		// was deleted and old messages are re-dispatched): it starts there.
		q.min.Store(idx)
	}
	for len(units) > 0 {
		fileStart := idx - idx%q.units
		f := q.fileFor(idx)
		if f == nil {
			var err error
			if f, err = s.createCQFile(q, fileStart); err != nil {
				return err
			}
		}
		if !f.mapTried && s.cqMmap {
			s.mapCQFile(q, f)
		}
		n := min(int64(len(units)), (fileStart+q.units-idx)*cqUnitSize)
		if err := f.write(units[:n], (idx-fileStart)*cqUnitSize); err != nil {
			return fmt.Errorf("write consume queue %s at unit %d: %w", f.path, idx, err)
		}
		f.dirty.Store(true)
		idx += n / cqUnitSize
		units = units[n:]
	}
	if idx > q.max.Load() {
		q.max.Store(idx)
	}
	return nil
}

// mapCQFile maps f for writeUnits, unless it cannot be mapped (then units go by pwrite).
//
// # Notes
//
// Units written through a mapping cost a copy instead of a pwrite per queue per dispatch
// pass (RocketMQ maps its consume-queue files too); under load that was most of the
// dispatcher's system calls. Reads keep using pread, which sees what the mapping wrote
// (one page cache), and the checkpoint's fdatasync writes mapped dirty pages as it writes
// written ones, so durability and recovery are unchanged. The file is extended to its full
// size sparse, not fallocated as an active segment is: a broker has a consume queue per
// queue of every topic, and reserving 20 bytes × ConsumeQueueUnits for each would reserve
// disk for queues that stay nearly empty. A page fault that fails for want of space (or
// an I/O error) raises SIGBUS, which guardedCopy turns into a write error that fails the
// store, as a failed pwrite would.
//
// Only the file being written is mapped: the queue's previously mapped file (full, since
// units are written in order) is unmapped first, so that a long-lived queue does not
// accumulate mappings (vm.max_map_count) as its files fill. Past maxCQMaps mapped files in
// the store (a broker with that many queues written), new files go by pwrite.
func (s *Store) mapCQFile(q *consumeQueue, f *cqFile) {
	f.mapTried = true
	if old := q.mapped; old != nil {
		q.mapped = nil
		old.unmap()
	}
	if s.cqMaps.Load() >= s.cqMapCap {
		return // pwrite: see maxCQMaps
	}
	m, err := mapSparse(f.f, q.units*cqUnitSize)
	if err != nil {
		s.log.Warn("consume-queue file not mapped; writing it with pwrite", "file", f.path, "err", err)
		return
	}
	if m == nil {
		return // no descriptor: pwrite
	}
	s.cqMaps.Add(1)
	f.mmu.Lock()
	f.m, f.maps = m, &s.cqMaps
	f.mmu.Unlock()
	q.mapped = f
}

// maxCQMaps bounds the consume-queue files mapped at once (Store.cqMaps): a quarter of
// Linux's default vm.max_map_count, leaving the rest to the Go runtime and the commit log.
// The queues written first keep their mappings; the rest write their units with pwrite,
// as they did before consume-queue files were mapped.
const maxCQMaps = 16384

func (s *Store) createCQFile(q *consumeQueue, start int64) (*cqFile, error) {
	q.mu.RLock()
	first := len(q.files) == 0
	q.mu.RUnlock()
	if first {
		// A new queue: its directories must be durable before any checkpoint counts on
		// its units.
		topicDir := filepath.Dir(q.dir)
		if err := s.fs.MkdirAll(q.dir, 0o755); err != nil {
			return nil, fmt.Errorf("create consume queue dir: %w", err)
		}
		for _, d := range []string{topicDir, s.cqRoot} {
			if err := s.fs.SyncDir(d); err != nil {
				return nil, fmt.Errorf("create consume queue dir: sync %s: %w", d, err)
			}
		}
	}
	path := filepath.Join(q.dir, offsetName(start*cqUnitSize))
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create consume queue file: %w", err)
	}
	if err := s.fs.SyncDir(q.dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("create consume queue file %s: sync dir: %w", path, err)
	}
	cf := &cqFile{start: start, path: path, f: f}
	q.mu.Lock()
	i, _ := slices.BinarySearchFunc(q.files, start, func(f *cqFile, s int64) int {
		switch {
		case f.start < s:
			return -1
		case f.start > s:
			return 1
		}
		return 0
	})
	q.files = slices.Insert(q.files, i, cf)
	q.mu.Unlock()
	return cf, nil
}

// cqReadStatus says why readUnits returned no units.
type cqReadStatus int

const (
	cqOK      cqReadStatus = iota
	cqNoFile               // the file holding the unit is gone (or not there yet)
	cqNoUnits              // idx is at or past max
)

// readUnits reads up to maxUnits units from idx into buf, never past max or the end of the
// file holding idx (a scan stays within one file, as RocketMQ's does). On cqNoFile, next is
// the first unit of the following file. A file that is there but cannot be read fails
// with an error wrapping ErrReadFailed: taking it for a removed one would move a reader
// past every unit it holds.
func (q *consumeQueue) readUnits(buf []byte, idx int64, maxUnits int) (units []byte, st cqReadStatus, next int64, err error) {
	hi := q.max.Load()
	if idx >= hi {
		return nil, cqNoUnits, idx, nil
	}
	f := q.fileFor(idx)
	if f == nil {
		return nil, cqNoFile, idx - idx%q.units + q.units, nil
	}
	n := min(int64(maxUnits), hi-idx, f.start+q.units-idx)
	b := buf[:n*cqUnitSize]
	if _, err := f.f.ReadAt(b, (idx-f.start)*cqUnitSize); err != nil {
		if errors.Is(err, os.ErrClosed) || q.fileFor(idx) != f {
			// Closed by retention or DeleteTopic while we read.
			return nil, cqNoFile, idx - idx%q.units + q.units, nil
		}
		// max is published after the write, so even a short read is a failed one.
		return nil, cqOK, idx, readFailure(q.readErrs, fmt.Errorf("read consume queue %s at unit %d: %w", f.path, idx, err))
	}
	return b, cqOK, idx, nil
}

// unitAt reads one unit. It fails with ErrNotFound when there is none at idx (or its file
// is gone), and with ErrReadFailed when it could not be read.
func (q *consumeQueue) unitAt(idx int64) (off int64, size int32, tags int64, err error) {
	var b [cqUnitSize]byte
	u, st, _, err := q.readUnits(b[:], idx, 1)
	if err != nil {
		return 0, 0, 0, err
	}
	if st != cqOK {
		return 0, 0, 0, fmt.Errorf("unit %s/%d@%d: %w", q.topic, q.qid, idx, ErrNotFound)
	}
	off, size, tags = decodeUnit(u)
	return off, size, tags, nil
}

func decodeUnit(u []byte) (off int64, size int32, tags int64) {
	return int64(binary.BigEndian.Uint64(u)), int32(binary.BigEndian.Uint32(u[8:])), int64(binary.BigEndian.Uint64(u[12:]))
}

func appendUnit(dst []byte, off int64, size int32, tags int64) []byte {
	dst = binary.BigEndian.AppendUint64(dst, uint64(off))
	dst = binary.BigEndian.AppendUint32(dst, uint32(size))
	return binary.BigEndian.AppendUint64(dst, uint64(tags))
}

func (q *consumeQueue) close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	hi := q.max.Load()
	for _, f := range q.files {
		errs = append(errs, f.close(min(max(hi-f.start, 0), q.units)*cqUnitSize))
	}
	q.files = nil
	return errors.Join(errs...)
}

// syncDirty fsyncs the queue's files written since the last call.
func (q *consumeQueue) syncDirty() error {
	q.mu.RLock()
	files := slices.Clone(q.files)
	q.mu.RUnlock()
	for _, f := range files {
		if f.dirty.Swap(false) {
			if err := f.f.Sync(); err != nil {
				if errors.Is(err, os.ErrClosed) {
					continue // removed by retention or DeleteTopic meanwhile
				}
				return fmt.Errorf("sync consume queue %s: %w", f.path, err)
			}
		}
	}
	return nil
}

// allQueues returns a snapshot of every consume queue.
func (s *Store) allQueues() []*consumeQueue {
	s.cqMu.RLock()
	defer s.cqMu.RUnlock()
	var out []*consumeQueue
	for _, qs := range s.cqs {
		for _, q := range qs {
			out = append(out, q)
		}
	}
	return out
}

// MaxOffset is the queue's exclusive max offset, 0 if there is no such queue.
func (s *Store) MaxOffset(topic string, queueID int32) int64 {
	if q := s.queue(topic, queueID); q != nil {
		return q.max.Load()
	}
	return 0
}

// MinOffset is the queue's first readable offset, 0 if there is no such queue.
func (s *Store) MinOffset(topic string, queueID int32) int64 {
	if q := s.queue(topic, queueID); q != nil {
		return q.min.Load()
	}
	return 0
}
