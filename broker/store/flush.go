package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/flowd-io/flowd/broker/store/vfs"
)

// flushCommitLog fsyncs every segment holding bytes in [flushed, written) and advances
// flushed. After an fsync error the store fails: the kernel may have dropped the dirty pages,
// so retrying could report durability that does not exist.
func (s *Store) flushCommitLog() error {
	s.flushRun.Lock()
	defer s.flushRun.Unlock()
	if err := s.writeFailure(); err != nil {
		return err
	}
	startedAt := s.opts.Now().UnixMilli()
	target := s.written.Load()
	from := s.flushed.Load()
	if target <= from {
		return nil
	}
	S := s.opts.SegmentSize
	s.segMu.RLock()
	var segs []*segment
	for _, seg := range s.segs {
		if seg.start+S > from && seg.start < target {
			segs = append(segs, seg)
		}
	}
	s.segMu.RUnlock()
	began := time.Now()
	for _, seg := range segs {
		if err := seg.f.Sync(); err != nil {
			err = fmt.Errorf("fsync segment %s: %w", seg.path, err)
			// Reported before the store fails: failing wakes the appenders waiting for
			// this flush, and whoever sees their error may look for it in the metrics.
			if fn := s.opts.OnFlush; fn != nil {
				fn(time.Since(began), 0, err)
			}
			return s.fail(err)
		}
	}
	if fn := s.opts.OnFlush; fn != nil {
		fn(time.Since(began), int(target-from), nil)
	}
	s.fsyncs.Add(1)
	s.flushedAt.Store(startedAt)
	s.flushed.Store(target)
	if s.opts.FlushMode == FlushSync {
		signal(s.commitReq)
	}
	if fn := s.onFlush.Load(); fn != nil {
		(*fn)()
	}
	return nil
}

// syncFlushLoop is FlushSync's group commit: it fsyncs whatever was written by then, and
// as soon as that fsync finished, again if more was written meanwhile, so that appends
// arriving during one fsync share the next and no tick delays it. The commit loop completes
// the appends each fsync covered, on its own goroutine, while the next fsync runs.
func (s *Store) syncFlushLoop() {
	defer s.wg.Done()
	for {
		select {
		case <-s.flushReq:
		case <-s.stop:
			return
		}
		for s.written.Load() > s.flushed.Load() {
			if err := s.flushCommitLog(); err != nil {
				break // the store failed; the commit loop fails the waiters
			}
		}
	}
}

// yieldBeforeSync lets the goroutines queued on this goroutine's P run before a periodic
// fsync blocks it. A goroutine in a system call keeps its P (the Go scheduler's processor,
// with its queue of runnable goroutines) until the runtime's monitor notices, and that
// monitor, once the process has been busy without long system calls, looks only every
// 10 ms and hands a P over on its second look: the goroutines queued behind an fsync of
// several milliseconds waited up to 20 ms, with other Ps busy, whatever they were. The
// flusher's ticker makes it the next to run on the P that fired it, ahead of what was
// already waiting there, such as a parked pull the dispatcher had just woken (traced: a pull
// woken 24.8 ms before it ran, the P handed over 20.9 ms into a 32 ms fdatasync). Yielding
// puts the flusher behind them, so it syncs once they ran or once another P takes it.
func yieldBeforeSync() { runtime.Gosched() }

// asyncFlushLoop is FlushAsync's flusher: every FlushInterval it fsyncs if at least
// FlushMinPages pages are dirty, and unconditionally once FullFlushInterval has passed.
func (s *Store) asyncFlushLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	lastFull := time.Now()
	minDirty := int64(s.opts.FlushMinPages) * pageSize
	for {
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
		dirty := s.written.Load() - s.flushed.Load()
		full := time.Since(lastFull) >= s.opts.FullFlushInterval
		if dirty >= minDirty || (full && dirty > 0) {
			yieldBeforeSync()
			s.flushCommitLog()
		}
		if full {
			lastFull = time.Now()
		}
	}
}

// checkpointLoop periodically fsyncs consume queues and writes the checkpoint.
func (s *Store) checkpointLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			yieldBeforeSync()
			if s.writeFailure() == nil {
				if err := s.checkpoint(); err != nil {
					s.log.Error("checkpoint failed", "err", err)
				}
			}
		case <-s.stop:
			return
		}
	}
}

// checkpointRecord is what the checkpoint file holds. Offsets are exact; timestamps
// (Unix ms, taken when the flush started) are kept for RocketMQ's timestamp rule.
type checkpointRecord struct {
	logOffset, logTime     int64 // commit log durable below logOffset
	queueOffset, queueTime int64 // consume-queue units of every message below queueOffset durable
}

const (
	checkpointMagic = 0x464C5744_434B5031 // "FLWDCKP1"
	checkpointSize  = 8 + 4*8 + 4
)

func (c checkpointRecord) encode() []byte {
	b := make([]byte, 0, checkpointSize)
	b = binary.BigEndian.AppendUint64(b, checkpointMagic)
	b = binary.BigEndian.AppendUint64(b, uint64(c.logOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(c.logTime))
	b = binary.BigEndian.AppendUint64(b, uint64(c.queueOffset))
	b = binary.BigEndian.AppendUint64(b, uint64(c.queueTime))
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func decodeCheckpoint(b []byte) (checkpointRecord, bool) {
	if len(b) < checkpointSize || binary.BigEndian.Uint64(b) != checkpointMagic ||
		crc32.ChecksumIEEE(b[:checkpointSize-4]) != binary.BigEndian.Uint32(b[checkpointSize-4:]) {
		return checkpointRecord{}, false
	}
	return checkpointRecord{
		logOffset:   int64(binary.BigEndian.Uint64(b[8:])),
		logTime:     int64(binary.BigEndian.Uint64(b[16:])),
		queueOffset: int64(binary.BigEndian.Uint64(b[24:])),
		queueTime:   int64(binary.BigEndian.Uint64(b[32:])),
	}, true
}

// checkpoint fsyncs the consume-queue files written since the last checkpoint and records
// how far the commit log and the consume queues are durable. The record is written in place
// with a CRC: a torn write reads as "no checkpoint", which recovers from the first segment.
func (s *Store) checkpoint() error {
	s.cpMu.Lock()
	defer s.cpMu.Unlock()
	if s.cp == nil {
		return ErrClosed
	}
	qAt := s.opts.Now().UnixMilli()
	qOff := s.dispatched.Load() // units below were written before this load
	for _, q := range s.allQueues() {
		if err := q.syncDirty(); err != nil {
			return s.fail(err)
		}
	}
	// The index is durable for every message below qOff too, before the record says so.
	if err := s.index.sync(); err != nil {
		return s.fail(err)
	}
	rec := checkpointRecord{logOffset: s.flushed.Load(), logTime: s.flushedAt.Load(), queueOffset: qOff, queueTime: qAt}
	if _, err := s.cp.WriteAt(rec.encode(), 0); err != nil {
		return s.fail(fmt.Errorf("write checkpoint: %w", err))
	}
	if err := s.cp.Sync(); err != nil {
		return s.fail(fmt.Errorf("fsync checkpoint: %w", err))
	}
	return nil
}

// openCheckpoint opens (creating) the checkpoint file and reads its record.
func (s *Store) openCheckpoint() (checkpointRecord, bool, error) {
	path := filepath.Join(s.dir, checkpointFile)
	f, err := s.fs.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return checkpointRecord{}, false, fmt.Errorf("open checkpoint: %w", err)
	}
	b := make([]byte, checkpointSize)
	n, err := readHead(f, b)
	if err != nil {
		f.Close()
		return checkpointRecord{}, false, readFailure(&s.readErrors, fmt.Errorf("read checkpoint %s: %w", path, err))
	}
	s.cp = f
	rec, ok := decodeCheckpoint(b[:n])
	return rec, ok, nil
}

// readHead reads the start of a small record file into b and returns how much of b it
// filled: less only when the file really is shorter (a crash before its first write
// completed). A read that comes back short of what the file holds is an error, not a
// short file: taken for one, a checkpoint would be ignored.
func readHead(f vfs.File, b []byte) (int, error) {
	n, err := f.ReadAt(b, 0)
	if err == nil || !errors.Is(err, io.EOF) {
		return n, err
	}
	fi, serr := f.Stat()
	if serr != nil {
		return n, fmt.Errorf("%w (and stat: %w)", err, serr)
	}
	if fi.Size() > int64(n) {
		return n, fmt.Errorf("%d of the file's %d bytes read: %w", n, fi.Size(), err)
	}
	return n, nil
}
