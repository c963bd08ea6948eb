package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// The seams replication builds on: a master reads its commit log as raw records
// (ReadRaw), a replica appends them at exactly its own end (AppendRaw), dispatched by its own
// dispatcher, and a replica whose log diverged cuts it back (Truncate, on a closed store).

// ErrNotAtEnd: AppendRaw was given records for an offset other than the store's end, so
// appending them would leave a hole or overwrite; the replica must resume from the end.
var ErrNotAtEnd = errors.New("records do not start at the commit log's end")

// ErrBadRecords: the bytes AppendRaw was given are not whole, valid stored records for
// where they go (a bad CRC, a PHYSICALOFFSET that is not theirs, a record across a segment's
// end, a queue offset that skips). Nothing was written.
var ErrBadRecords = errors.New("bad replicated records")

// ReadRaw returns a copy of the commit log's raw records from off: whole stored messages of
// one segment, at most limit bytes of them (but always at least one message when one starts at
// off), and next, the offset to read from next. When off is where a segment's blank marker
// starts, the result is that 8-byte marker and next is the next segment's start. At the
// written end it returns no bytes and next == off. off must be where a record starts: a
// replica only asks for its own end, which is one.
func (s *Store) ReadRaw(off int64, limit int) (b []byte, next int64, err error) {
	written := s.written.Load()
	switch {
	case off == written:
		return nil, off, nil
	case off < s.minOffset.Load() || off > written:
		return nil, 0, fmt.Errorf("read raw at %d: outside [%d, %d]: %w", off, s.minOffset.Load(), written, ErrNotFound)
	}
	S := s.opts.SegmentSize
	segEnd := off - off%S + S
	rem := min(written, segEnd) - off
	// At least a header's worth, so that a small max still reads one whole record.
	n := min(rem, max(int64(limit), minStoredSize), int64(s.opts.MaxMessageSize)+blankMin)
	for {
		buf := make([]byte, n)
		if err := s.readLog(buf, off); err != nil {
			return nil, 0, fmt.Errorf("read raw at %d: %w", off, err)
		}
		p, stop, reason, err := walkMessages(buf, off, segEnd, false, func(*msgInfo) error { return nil })
		switch {
		case err != nil:
			return nil, 0, fmt.Errorf("read raw at %d: %w", off, err)
		case stop == walkBlank && p == 0:
			return buf[:blankMin], segEnd, nil
		case stop == walkBad || stop == walkZero:
			if p > 0 {
				return buf[:p], off + p, nil
			}
			if reason == "" {
				reason = "no record starts there"
			}
			return nil, 0, fmt.Errorf("read raw at %d: %s: %w", off, reason, ErrNotFound)
		case p == 0:
			// One message larger than limit: read it whole.
			size := int64(int32(binary.BigEndian.Uint32(buf)))
			if size <= n || size > rem {
				return nil, 0, fmt.Errorf("read raw at %d: a record of %d bytes runs past the written end %d: %w", off, size, written, ErrNotFound)
			}
			n = size
			continue
		}
		return buf[:p], off + p, nil
	}
}

// AppendRaw appends records that ReadRaw returned on another store (the master's) at off,
// which must be this store's end. Each record is checked (magic, sizes, PHYSICALOFFSET, body
// CRC, its queue offset the next of its queue) before anything is written; a blank marker
// rolls to the next segment, as the master's roll did. The store's own dispatcher then builds
// the consume queues and key index, as for a Put. It returns the new end.
//
// AppendRaw does not wait for an fsync: in FlushSync mode it asks the flusher for one, and
// Stats().FlushedOffset tells when it is durable.
func (s *Store) AppendRaw(off int64, b []byte) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if err := s.writeFailure(); err != nil {
		return 0, err
	}
	if off != s.wpos {
		return 0, fmt.Errorf("append raw at %d, end is %d: %w", off, s.wpos, ErrNotAtEnd)
	}
	if len(b) == 0 {
		return s.wpos, nil
	}
	segEnd := s.active.start + s.opts.SegmentSize
	if len(b) == blankMin && binary.BigEndian.Uint32(b[4:]) == protocol.MagicBlank {
		if total := int64(int32(binary.BigEndian.Uint32(b))); total != segEnd-off {
			return 0, fmt.Errorf("append raw at %d: blank marker of %d bytes, %d remain: %w", off, total, segEnd-off, ErrBadRecords)
		}
		if err := s.rollLocked(); err != nil {
			return 0, s.fail(err)
		}
		signal(s.dispatchReq)
		return s.wpos, nil
	}
	next, lastTs, err := s.checkRaw(off, b, segEnd)
	if err != nil {
		return 0, err
	}
	s.awaitZeroingLocked(off + int64(len(b)))
	if err := s.active.writeAt(b, off-s.active.start); err != nil {
		return 0, s.fail(fmt.Errorf("write segment %s at %d: %w", s.active.path, off-s.active.start, err))
	}
	for k, q := range next {
		s.setQueueOffsetLocked(k, q)
	}
	s.lastTs = max(s.lastTs, lastTs)
	s.wpos = off + int64(len(b))
	s.written.Store(s.wpos)
	signal(s.dispatchReq)
	if s.opts.FlushMode == FlushSync {
		signal(s.flushReq)
	}
	if off/prefaultStep != s.wpos/prefaultStep {
		signal(s.prefaultReq)
	}
	return s.wpos, nil
}

// checkRaw validates b as whole records from off within the segment ending at segEnd, and
// returns the queue offsets they move to and their latest store time. It runs under s.mu.
func (s *Store) checkRaw(off int64, b []byte, segEnd int64) (map[qkey]int64, int64, error) {
	next := map[qkey]int64{}
	var lastTs int64
	var qerr error
	p, stop, reason, err := walkMessages(b, off, segEnd, true, func(m *msgInfo) error {
		k := qkey{string(m.topic), m.queueID}
		want, ok := next[k]
		if !ok {
			want = s.queueOffsetLocked(k)
		}
		if m.queueOffset != want {
			qerr = fmt.Errorf("record at %d of %s/%d has queue offset %d, expected %d", m.phys, k.topic, k.qid, m.queueOffset, want)
			return qerr
		}
		next[k] = want + 1
		lastTs = max(lastTs, m.storeTs)
		return nil
	})
	switch {
	case qerr != nil:
		return nil, 0, fmt.Errorf("append raw at %d: %w: %w", off, ErrBadRecords, qerr)
	case err != nil:
		return nil, 0, fmt.Errorf("append raw at %d: %w", off, err)
	case stop == walkBad:
		return nil, 0, fmt.Errorf("append raw at %d: record at %d: %s: %w", off, off+p, reason, ErrBadRecords)
	case p != int64(len(b)):
		return nil, 0, fmt.Errorf("append raw at %d: %d of %d bytes are whole records: %w", off, p, len(b), ErrBadRecords)
	}
	return next, lastTs, nil
}

// Truncate cuts the commit log of the closed store in dir back to off (which should be
// where a record starts; a record it cuts through is dropped whole): what follows is zeroed
// and later segments removed. The next Open then recovers as after a crash and drops the
// consume-queue units and key-index entries past off, so that the store ends exactly at
// off. A replica whose log diverged from its master's (an epoch the master never had)
// cuts it so, at the last offset the two share. opts must be the options the store is
// opened with (SegmentSize); Truncate takes the directory's lock.
func Truncate(dir string, off int64, opts Options) error {
	o, err := opts.withDefaults()
	if err != nil {
		return err
	}
	fs := o.FS
	lk, err := fs.Lock(filepath.Join(dir, lockFileName))
	if err != nil {
		return fmt.Errorf("truncate store %s: %w", dir, err)
	}
	defer lk.Close()
	clDir := filepath.Join(dir, commitLogDir)
	ents, err := fs.ReadDir(clDir)
	if err != nil {
		return fmt.Errorf("truncate store %s: list commit log: %w", dir, err)
	}
	S := o.SegmentSize
	first := int64(-1)
	for _, e := range ents {
		start, ok := parseOffsetName(e.Name())
		if !ok || e.IsDir() {
			continue
		}
		if first < 0 || start < first {
			first = start
		}
		path := filepath.Join(clDir, e.Name())
		switch {
		case start > off-off%S:
			if err := fs.Remove(path); err != nil {
				return fmt.Errorf("truncate store %s: remove segment %s: %w", dir, path, err)
			}
		case start == off-off%S:
			if err := zeroFrom(fs, path, off-start, S); err != nil {
				return fmt.Errorf("truncate store %s: %w", dir, err)
			}
		}
	}
	if first >= 0 && off < first {
		return fmt.Errorf("truncate store %s to %d: the log starts at %d: %w", dir, off, first, ErrNotFound)
	}
	// The abort marker makes the next Open validate the tail and cut the consume queues
	// and key index back to the log's new end.
	f, err := fs.Create(filepath.Join(dir, abortFile))
	if err != nil {
		return fmt.Errorf("truncate store %s: create abort marker: %w", dir, err)
	}
	f.Close()
	if err := fs.SyncDir(clDir); err != nil {
		return fmt.Errorf("truncate store %s: %w", dir, err)
	}
	if err := fs.SyncDir(dir); err != nil {
		return fmt.Errorf("truncate store %s: %w", dir, err)
	}
	return nil
}

// zeroFrom zeroes a segment from rel on by shrinking the file and growing it back (the
// tail becomes a hole), then fsyncs it.
func zeroFrom(fs vfs.FS, path string, rel, size int64) error {
	f, err := fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open segment %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(rel); err != nil {
		return fmt.Errorf("cut segment %s at %d: %w", path, rel, err)
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size segment %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync segment %s: %w", path, err)
	}
	return nil
}

// SegmentSize is Options.SegmentSize: a replica's must equal its master's, since records
// sit at the same offsets in both logs and never cross a segment's end.
func (s *Store) SegmentSize() int64 { return s.opts.SegmentSize }

// SetAppendHook sets what a replica set's master is told after every append of a Put (on
// the appending goroutine, once the store's lock is released), so that its stream sends the
// new records at once rather than look for them; nil clears it. fn must be quick and must
// not block.
func (s *Store) SetAppendHook(fn func()) { setHook(&s.onAppend, fn) }

// SetFlushHook sets what a replica is told after every fsync of the commit log moved its
// flushed end (on the flusher's goroutine), so that under store.flush sync it acknowledges
// what became durable at once; nil clears it. fn must be quick and must not block.
func (s *Store) SetFlushHook(fn func()) { setHook(&s.onFlush, fn) }

func setHook(p *atomic.Pointer[func()], fn func()) {
	if fn == nil {
		p.Store(nil)
		return
	}
	p.Store(&fn)
}

// appended calls the append hook, if one is set.
func (s *Store) appended() {
	if fn := s.onAppend.Load(); fn != nil {
		(*fn)()
	}
}

// Positions is the commit log's written end and the end an fsync covers, without the
// rest of Stats (which walks the segment and queue lists): a replica reads them on every
// acknowledgement.
func (s *Store) Positions() (written, flushed int64) {
	return s.written.Load(), s.flushed.Load()
}
