package store

import (
	"fmt"
	"math"
	"os"
)

const (
	// prefaultAhead is how far past the write position the prefaulter keeps the active
	// segment's mapping populated.
	prefaultAhead = 4 << 20
	// prefaultStep is how much one madvise call populates, and how often (in bytes
	// appended) the appender wakes the prefaulter.
	prefaultStep = 1 << 20
	// prefaultAlign aligns both ends of every populated range: madvise needs a
	// page-aligned start, and 64 KiB is a multiple of every page size Linux uses.
	prefaultAlign = 64 << 10
)

// prefaultLoop keeps the pages just ahead of the write position of the mapped active
// segment faulted in, moving the kernel's page allocation and zeroing off the append path
// (RocketMQ's "warm mapped file" does the same by touching pages).
//
// # Notes
//
// Pages are populated writable (MADV_POPULATE_WRITE): the append's copy then takes no
// fault at all. Populated readable only (MADV_POPULATE_READ), each page still costs the
// append a write-protect fault; BenchmarkAppend (1 KiB, async) measured 1.43-1.53 us per
// append writable against 1.63-1.74 us readable. The cost of writable: the zero pages
// ahead are dirty, so each periodic fdatasync also writes back up to prefaultAhead of
// zeros (a few MiB per FlushInterval), and the append into a page written back that way
// takes a write-protect fault, as it would have with readable pages. What a crash leaves
// is unchanged: the pages hold zeros, as the fallocated file reads anyway, and recovery
// stops at the first zero size field in both cases.
//
// A populating step is at most prefaultStep and the appender signals every prefaultStep
// bytes, so the prefaulter stays about prefaultAhead ahead; when the appender catches up
// with it (a burst right after a roll) it faults the pages itself, through the kernel's
// readahead, which with a large read_ahead_kb zeroes megabytes in one fault.
func (s *Store) prefaultLoop() {
	defer s.wg.Done()
	var seg *segment
	var done int64   // bytes of seg populated (relative to its start)
	var zeros []byte // FlushSync: what zeroAhead writes
	for {
		select {
		case <-s.prefaultReq:
		case <-s.stop:
			return
		}
		for {
			cur := s.activeSeg.Load()
			if cur != seg {
				seg, done = cur, 0
			}
			if seg == nil {
				break
			}
			w := s.written.Load() - seg.start
			if w < 0 || w > s.opts.SegmentSize {
				break // rolled meanwhile; the next signal brings the new segment
			}
			from, to := prefaultRange(w, done, s.opts.SegmentSize)
			if from >= to {
				break
			}
			// Not under seg.mu: zeroMapped takes s.mu, under which a roll takes seg.mu.
			s.zeroMapped(seg, from, to, &zeros)
			seg.mu.RLock()
			mapped := seg.m != nil
			if mapped {
				prefault(seg.m[from:to])
			}
			seg.mu.RUnlock()
			if !mapped && (s.opts.FlushMode != FlushSync || !s.zeroAhead(seg, from, to, &zeros)) {
				break // DisableMmap, or nothing more to zero in this segment
			}
			done = to
		}
	}
}

// zeroMapped writes zeros with pwrite over [from, to) of the mapped active segment seg
// (relative to its start; only the whole pages past the write position), before the
// prefaulter populates the range: the pages then enter the page cache through the write
// path, already up to date, and the populate only maps them. Populated straight from a
// fallocated file, each page is read in through readahead, zero-filled there
// (ext4_mpage_readpages → zero_user_segments) and made writable through ext4's page_mkwrite
// on an unwritten extent. BenchmarkSegmentFill: 281-304 against 476-505 ns of CPU per KiB
// appended, into memory the kernel recycles (a broker whose page cache has filled the
// machine); into memory never touched before, the first touch costs the most either way
// and the gain is smaller. See docs/PERFORMANCE.md ("The commit log's fresh pages").
//
// The appenders write the same file through the mapping without the prefaulter's
// knowledge, so the range is announced under s.mu (zeroFrom, zeroDone): an append that would
// reach into it waits for the zeros to be written first (awaitZeroingLocked), and one that
// came before has moved the write position, which bounds the range. A failed write only
// leaves the populate to fault the pages in the usual way.
func (s *Store) zeroMapped(seg *segment, from, to int64, zeros *[]byte) {
	if _, ok := seg.f.(interface{ Fd() uintptr }); !ok {
		return
	}
	page := int64(os.Getpagesize())
	s.mu.Lock()
	// seg.m changes only under s.mu (activate, unmap), so it is read here without seg.mu.
	if s.closed || s.active != seg || seg.m == nil || s.writeFailure() != nil {
		s.mu.Unlock()
		return
	}
	lo := max(from, s.wpos-seg.start)
	lo += (page - lo%page) % page // the write position's page holds data: leave it whole
	if lo >= to {
		s.mu.Unlock()
		return
	}
	done := make(chan struct{})
	s.zeroDone = done
	s.zeroFrom.Store(seg.start + lo)
	s.mu.Unlock()
	if int64(len(*zeros)) < to-lo {
		*zeros = make([]byte, prefaultStep)
	}
	_, err := seg.f.WriteAt((*zeros)[:to-lo], lo)
	s.zeroFrom.Store(math.MaxInt64)
	close(done)
	s.zeroWrites.Add(1)
	if err != nil {
		s.log.Debug("zeroing ahead of the mapped commit log failed", "segment", seg.path, "err", err)
	}
}

// awaitZeroingLocked waits, before a write into the active segment that ends at end (a
// commit-log offset), until the prefaulter has finished writing zeros from zeroFrom on, if
// the write would reach there. s.mu is held; zeroMapped does not need it to finish.
func (s *Store) awaitZeroingLocked(end int64) {
	if end > s.zeroFrom.Load() {
		<-s.zeroDone
	}
}

// zeroChunk is how much of a zeroAhead step is written under the append lock at once: a
// write into the page cache of this size takes some tens of microseconds, which appends
// wait at most.
const zeroChunk = 128 << 10

// zeroAhead is prefaultLoop's work in FlushSync mode, where the active segment is written
// with pwrite: it writes zeros to [from, to) of seg (never below the write position) and
// fdatasyncs them, so that the group commit's fdatasyncs overwrite blocks the file system
// has already allocated and written, and need not also commit the allocation (a journal
// commit, for a sparse or fallocated file) with every group of appends. It reports false
// when it stopped: seg is no longer the active segment, the store closed, the file has no
// descriptor (the fault-injecting vfs, whose write and sync faults are the appends'), or a
// zero write failed (a full disk: the appends will see it themselves).
//
// # Notes
//
// Measured on ext4 (virtio disk), interleaved on one machine: a 24 KiB pwrite+fdatasync
// (a group of about 24 sends of 1 KiB) took 226 us at the median into zeroed blocks, 335 us
// into a sparse file and 468 us into a fallocated one; at 64 KiB 356, 497 and 686 us. At
// 1 KiB there was no difference. The cost is writing every byte of the log twice (once as
// zeros, in 1 MiB steps, off the appenders' path).
//
// An fsync error here fails the store as the flusher's does: the descriptor is shared,
// and an error the kernel reported to this fsync would not be reported to the flusher's.
func (s *Store) zeroAhead(seg *segment, from, to int64, zeros *[]byte) bool {
	if _, ok := seg.f.(interface{ Fd() uintptr }); !ok {
		return false
	}
	if *zeros == nil {
		*zeros = make([]byte, zeroChunk)
	}
	wrote := false
	for off := from; off < to; off += zeroChunk {
		end := min(off+zeroChunk, to)
		s.mu.Lock()
		if s.closed || s.active != seg || s.writeFailure() != nil {
			s.mu.Unlock()
			return false
		}
		lo := max(off, s.wpos-seg.start) // bytes at and past the write position are zeros already
		var err error
		if lo < end {
			_, err = seg.f.WriteAt((*zeros)[:end-lo], lo)
			wrote = true
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Debug("zeroing ahead of the commit log stopped", "segment", seg.path, "err", err)
			return false
		}
	}
	if wrote {
		if err := seg.f.Sync(); err != nil {
			s.fail(fmt.Errorf("fsync zeroed segment %s: %w", seg.path, err))
			return false
		}
	}
	return true
}

// prefaultRange is the next range of the segment to populate, given the write position w
// and the end of what is already populated (done), both relative to the segment's start:
// at most prefaultStep bytes from the later of done and w's page, up to prefaultAhead past
// w, never past the segment. Both ends are multiples of prefaultAlign: madvise rejects an
// unaligned start with EINVAL (the error is ignored), so one unaligned step would end all
// prefaulting of the segment, as it once did. An empty range (from >= to) means there is
// nothing to do until the writer moves on.
func prefaultRange(w, done, segSize int64) (from, to int64) {
	from = max(done, w-w%prefaultAlign)
	from -= from % prefaultAlign
	end := min(w+prefaultAhead, segSize)
	end -= end % prefaultAlign
	to = min(from+prefaultStep, end)
	return from, to
}
