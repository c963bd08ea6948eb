package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// recover brings the files in s.dir to a consistent state and sets every position. It runs
// in Open, before any goroutine starts, so it takes locks only where helpers expect them.
func (s *Store) recover() error {
	t0 := time.Now()
	rep := RecoveryReport{}
	_, err := s.fs.Stat(filepath.Join(s.dir, abortFile))
	abort := err == nil
	if err != nil && !isNotExist(err) {
		return fmt.Errorf("stat abort marker: %w", err)
	}
	cp, cpOK, err := s.openCheckpoint()
	if err != nil {
		return err
	}
	rep.Clean, rep.CheckpointFound = !abort, cpOK
	if err := s.loadSegments(); err != nil {
		return err
	}
	if err := s.loadQueues(); err != nil {
		return err
	}
	crash := abort || !cpOK
	if s.dead, err = s.loadTombstones(); err != nil {
		return err
	}
	if !s.opts.DisableIndex {
		if s.index, err = openIndex(s, crash); err != nil {
			return err
		}
	}

	S := s.opts.SegmentSize
	var end int64
	if len(s.segs) == 0 {
		end = 0
		if crash && len(s.allQueues()) > 0 {
			s.log.Warn("commit log is empty but consume queues exist; they will be emptied")
		}
	} else {
		first := s.segs[0].start
		last := s.segs[len(s.segs)-1].start
		segIndex := func(off int64) int { return int((min(max(off, first), last) - first) / S) }
		var idx int
		var redispatchFrom int64
		switch {
		case crash && cpOK:
			// RocketMQ's rule: validate from the last segment whose first message is older
			// than the checkpoint (less a 3 s margin), and never later than the segment
			// holding the checkpoint's offsets.
			idx = segIndex(min(cp.logOffset, cp.queueOffset))
			limit := min(cp.logTime, cp.queueTime) - 3000
			for idx > 0 {
				t, ok, err := s.firstMessageTime(s.segs[idx])
				if err != nil {
					return err
				}
				if ok && t <= limit {
					break
				}
				idx--
			}
			// Re-dispatch only what the checkpoint does not cover: units below
			// cp.queueOffset are durable, and re-dispatching older messages would bring a
			// topic deleted since (DeleteTopic checkpoints) back into its new queues.
			redispatchFrom = max(cp.queueOffset, s.segs[idx].start)
		case crash:
			idx, redispatchFrom = 0, first
		default:
			// Clean stop: validate the last few segments; nothing should need re-dispatch,
			// but if the checkpoint says otherwise, trust it.
			idx = max(0, len(s.segs)-3)
			redispatchFrom = max(cp.queueOffset, first)
			idx = min(idx, segIndex(redispatchFrom))
		}
		rep.ValidatedFrom = s.segs[idx].start
		// Re-dispatch re-indexes what follows redispatchFrom.
		if err := s.index.truncate(redispatchFrom); err != nil {
			return err
		}
		end, err = s.scanLog(idx, redispatchFrom, crash, &rep)
		if err != nil {
			return err
		}
	}
	rep.End = end
	if err := s.index.truncate(end); err != nil { // the log may have lost what the index holds
		return err
	}

	if err := s.recoverQueues(end, &rep); err != nil {
		return err
	}
	if err := s.resumeAt(end, rep.ValidatedFrom); err != nil {
		return err
	}
	rep.Duration = time.Since(t0)
	s.recovery = rep
	attrs := []any{"clean", rep.Clean, "checkpoint", rep.CheckpointFound, "validated_from", rep.ValidatedFrom,
		"end", rep.End, "redispatched", rep.Redispatched, "removed_units", rep.RemovedUnits, "took", rep.Duration}
	if rep.Cut {
		s.log.Warn("recovery cut the commit log", append(attrs, "cut_at", rep.CutAt, "cut_bytes", rep.CutBytes,
			"reason", rep.CutReason, "removed_segments", rep.RemovedSegments)...)
	} else {
		msg := "store opened"
		if !rep.Clean {
			msg = "store recovered after an unclean stop"
		}
		s.log.Info(msg, attrs...)
	}
	return nil
}

// recoverQueues drops the consume-queue units past the recovered end of the log, then
// aligns min offsets with the commit log's first segment.
func (s *Store) recoverQueues(end int64, rep *RecoveryReport) error {
	if len(s.segs) > 0 {
		s.minOffset.Store(s.segs[0].start)
	} else {
		s.minOffset.Store(end)
	}
	if s.dead.prune(s.minOffset.Load()) {
		if err := s.writeTombstones(s.dead); err != nil {
			return err
		}
	}
	for _, q := range s.allQueues() {
		n, err := s.truncateQueue(q, end)
		if err != nil {
			return err
		}
		rep.RemovedUnits += n
		if err := s.correctMinOffset(q, s.minOffset.Load()); err != nil {
			return err
		}
		s.setQueueOffsetLocked(qkey{q.topic, q.qid}, q.max.Load())
	}
	return nil
}

// resumeAt sets the write position to end (the recovered end of the log), makes what was
// kept from validatedFrom on durable, checkpoints it and puts the abort marker in place.
func (s *Store) resumeAt(end, validatedFrom int64) error {
	// A blank marker can end the last segment, or there may be none.
	if len(s.segs) == 0 || end >= s.segs[len(s.segs)-1].start+s.opts.SegmentSize {
		seg, err := s.createSegment(end)
		if err != nil {
			return err
		}
		s.segs = append(s.segs, seg)
		if len(s.segs) == 1 {
			s.minOffset.Store(seg.start)
		}
	}
	if err := s.activate(s.segs[len(s.segs)-1]); err != nil {
		return err
	}
	s.wpos = end
	s.written.Store(end)
	s.dispatched.Store(end)
	// Everything kept must be durable before the checkpoint says so: after a process crash
	// the tail may still be only in the page cache.
	for _, seg := range s.segs[segIndexOf(s.segs, validatedFrom):] {
		if err := seg.f.Sync(); err != nil {
			return fmt.Errorf("fsync segment %s: %w", seg.path, err)
		}
	}
	s.flushed.Store(end)
	s.flushedAt.Store(s.opts.Now().UnixMilli())
	if err := s.checkpoint(); err != nil {
		return err
	}
	if err := s.writeFailure(); err != nil {
		return err
	}
	f, err := s.fs.Create(filepath.Join(s.dir, abortFile))
	if err != nil {
		return fmt.Errorf("create abort marker: %w", err)
	}
	f.Close()
	if err := s.fs.SyncDir(s.dir); err != nil {
		return fmt.Errorf("sync %s: %w", s.dir, err)
	}
	return nil
}

func segIndexOf(segs []*segment, off int64) int {
	for i, seg := range segs {
		if seg.start >= off {
			return i
		}
	}
	return len(segs)
}

// loadSegments opens every commit-log segment and checks that they are contiguous.
func (s *Store) loadSegments() error {
	ents, err := s.fs.ReadDir(s.clDir)
	if err != nil {
		return fmt.Errorf("list commit log: %w", err)
	}
	S := s.opts.SegmentSize
	for _, e := range ents {
		start, ok := parseOffsetName(e.Name())
		if !ok || e.IsDir() {
			s.log.Warn("ignoring unexpected file in commit log", "name", e.Name())
			continue
		}
		path := filepath.Join(s.clDir, e.Name())
		if start%S != 0 {
			return fmt.Errorf("segment %s does not start at a multiple of SegmentSize %d (was it changed?): %w", path, S, ErrCorrupt)
		}
		if n := len(s.segs); n > 0 && s.segs[n-1].start+S != start {
			return fmt.Errorf("commit log has a gap between %s and %s: %w", s.segs[n-1].path, path, ErrCorrupt)
		}
		f, err := s.fs.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open segment %s: %w", path, err)
		}
		s.segs = append(s.segs, &segment{start: start, path: path, f: f, limit: S, readErrs: &s.readErrors})
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("stat segment %s: %w", path, err)
		}
		switch {
		case fi.Size() > S:
			return fmt.Errorf("segment %s has %d bytes, more than SegmentSize %d (was it changed?): %w", path, fi.Size(), S, ErrCorrupt)
		case fi.Size() < S: // created, but its sizing was lost
			if err := f.Truncate(S); err != nil {
				return fmt.Errorf("size segment %s: %w", path, err)
			}
		}
	}
	return nil
}

// firstMessageTime is the store timestamp of a segment's first message; ok is false when
// it does not start with one.
func (s *Store) firstMessageTime(seg *segment) (t int64, ok bool, err error) {
	var b [protocol.StoredBornHostAt + 20 + 8]byte
	if _, err := seg.f.ReadAt(b[:], 0); err != nil {
		return 0, false, readFailure(&s.readErrors, fmt.Errorf("read segment %s at 0: %w", seg.path, err))
	}
	if binary.BigEndian.Uint32(b[4:]) != protocol.MagicV1 {
		return 0, false, nil
	}
	at := protocol.StoreTimestampAt(int32(binary.BigEndian.Uint32(b[protocol.StoredSysFlagAt:])))
	return int64(binary.BigEndian.Uint64(b[at:])), true, nil
}

// scanLog validates the commit log from segment idx on, re-dispatching every valid message
// at or after redispatchFrom, cuts at the first bad message, and returns the end.
//
// After a crash (zeroTail) the rest of the segment past the end is also checked and zeroed:
// a power cut can persist later pages of a write but not earlier ones, and stale messages
// left there could line up with new ones after the next crash.
func (s *Store) scanLog(idx int, redispatchFrom int64, zeroTail bool, rep *RecoveryReport) (int64, error) {
	S := s.opts.SegmentSize
	d := newDispatcher(s, false)
	buf := make([]byte, 4<<20)
	var end int64
	bad := ""
	i := idx
scan:
	for ; i < len(s.segs); i++ {
		seg := s.segs[i]
		segEnd := seg.start + S
		pos := seg.start
		for {
			n := min(segEnd-pos, int64(len(buf)))
			b := buf[:n]
			if _, err := seg.f.ReadAt(b, pos-seg.start); err != nil {
				// Never a cut: what could not be read is not known to be bad.
				return 0, readFailure(&s.readErrors, fmt.Errorf("read segment %s at %d: %w", seg.path, pos-seg.start, err))
			}
			p, stop, reason, err := walkMessages(b, pos, segEnd, true, func(m *msgInfo) error {
				if m.phys < redispatchFrom || s.dead.buried(m.topic, m.phys) {
					return nil // dispatched before the checkpoint, or of a deleted topic
				}
				if err := d.add(m); err != nil {
					return err
				}
				rep.Redispatched++
				return nil
			})
			if err != nil {
				return 0, err
			}
			end = pos + p
			switch stop {
			case walkZero:
				if i < len(s.segs)-1 {
					bad = "zero-filled gap before later segments"
				}
				break scan
			case walkBlank:
				if total := int64(int32(binary.BigEndian.Uint32(b[p:]))); total != segEnd-end {
					bad = fmt.Sprintf("blank marker of %d bytes, %d remain in the segment", total, segEnd-end)
					break scan
				}
				end = segEnd
				if err := d.commit(end); err != nil {
					return 0, err
				}
				continue scan
			case walkBad:
				bad = reason
				break scan
			}
			if p == 0 { // the next message does not fit the chunk
				if int64(len(buf)) >= segEnd-pos {
					bad = "a message runs past the segment's end"
					break scan
				}
				// A message larger than the buffer (MaxMessageSize > 4 MiB).
				buf = make([]byte, int32(binary.BigEndian.Uint32(b)))
			}
			if err := d.commit(pos + p); err != nil {
				return 0, err
			}
			pos += p
		}
	}
	if err := d.commit(end); err != nil {
		return 0, err
	}
	if i == len(s.segs) {
		return end, nil // the last segment ended with a blank marker
	}
	if err := s.cutLog(i, end, bad, zeroTail, rep); err != nil {
		return 0, err
	}
	return end, nil
}

// cutLog ends the log at end, in segment i: it zeroes what follows end there (so that a
// later scan cannot mistake stale bytes for messages) and removes later segments. bad is
// why the message at end was rejected ("" if the log simply ends there); after a crash
// (zeroTail) the rest of the segment is zeroed even then.
func (s *Store) cutLog(i int, end int64, bad string, zeroTail bool, rep *RecoveryReport) error {
	if bad != "" {
		rep.Cut, rep.CutAt, rep.CutReason = true, end, bad
	}
	seg := s.segs[i]
	if bad == "" && zeroTail {
		// Looking for stray data is bounded (the rest of the segment is normally a hole
		// that is slow to read through); zeroing below is not.
		n, err := s.dataAfter(seg, end, tornWindow)
		if err != nil {
			return err
		}
		if n > 0 {
			rep.Cut, rep.CutAt, rep.CutReason = true, end, "data after a zero-filled gap (torn write)"
			rep.CutBytes += n
		}
	} else if bad != "" {
		n, err := s.dataAfter(seg, end, s.opts.SegmentSize)
		if err != nil {
			return err
		}
		rep.CutBytes += n
	}
	if rep.Cut || zeroTail {
		if err := seg.f.Truncate(end - seg.start); err != nil {
			return fmt.Errorf("cut segment %s at %d: %w", seg.path, end-seg.start, err)
		}
		if err := seg.f.Truncate(s.opts.SegmentSize); err != nil {
			return fmt.Errorf("size segment %s: %w", seg.path, err)
		}
		if err := seg.f.Sync(); err != nil {
			return fmt.Errorf("fsync segment %s: %w", seg.path, err)
		}
	}
	if i+1 < len(s.segs) {
		for _, later := range s.segs[i+1:] {
			n, err := s.dataAfter(later, later.start, s.opts.SegmentSize)
			if err != nil {
				return err
			}
			rep.CutBytes += n
			later.f.Close()
			if err := s.fs.Remove(later.path); err != nil {
				return fmt.Errorf("remove segment %s: %w", later.path, err)
			}
			rep.RemovedSegments = append(rep.RemovedSegments, filepath.Base(later.path))
		}
		s.segs = s.segs[:i+1]
		if err := s.fs.SyncDir(s.clDir); err != nil {
			return fmt.Errorf("sync %s: %w", s.clDir, err)
		}
	}
	return nil
}

// tornWindow bounds the search for stray data after a zero-filled end after a crash.
const tornWindow = 8 << 20

// dataAfter is the number of bytes from off to the last non-zero byte of seg within
// [off, off+window).
func (s *Store) dataAfter(seg *segment, off, window int64) (int64, error) {
	buf := make([]byte, 1<<20)
	hi := min(seg.start+s.opts.SegmentSize, off+window)
	for hi > off {
		lo := max(off, hi-int64(len(buf)))
		b := buf[:hi-lo]
		if _, err := seg.f.ReadAt(b, lo-seg.start); err != nil {
			return 0, readFailure(&s.readErrors, fmt.Errorf("read segment %s at %d: %w", seg.path, lo-seg.start, err))
		}
		for j := len(b) - 1; j >= 0; j-- {
			if b[j] != 0 {
				return lo + int64(j) + 1 - off, nil
			}
		}
		hi = lo
	}
	return 0, nil
}

// loadQueues opens every consume-queue file and sets each queue's min and max, trimming a
// partial or zero-filled tail (what a power cut leaves after the file grew but before its
// data reached the disk).
func (s *Store) loadQueues() error {
	topics, err := s.fs.ReadDir(s.cqRoot)
	if err != nil {
		return fmt.Errorf("list consume queues: %w", err)
	}
	U := int64(s.opts.ConsumeQueueUnits)
	for _, te := range topics {
		if !te.IsDir() || !validTopic(te.Name()) {
			s.log.Warn("ignoring unexpected entry in consume queues", "name", te.Name())
			continue
		}
		qids, err := s.fs.ReadDir(filepath.Join(s.cqRoot, te.Name()))
		if err != nil {
			return fmt.Errorf("list consume queues of %q: %w", te.Name(), err)
		}
		for _, qe := range qids {
			id, err := strconv.ParseInt(qe.Name(), 10, 32)
			if !qe.IsDir() || err != nil || id < 0 {
				s.log.Warn("ignoring unexpected entry in consume queues", "topic", te.Name(), "name", qe.Name())
				continue
			}
			q, _ := s.queueOrCreate([]byte(te.Name()), int32(id))
			ents, err := s.fs.ReadDir(q.dir)
			if err != nil {
				return fmt.Errorf("list consume queue %s: %w", q.dir, err)
			}
			for _, fe := range ents {
				pos, ok := parseOffsetName(fe.Name())
				if !ok || fe.IsDir() {
					continue
				}
				path := filepath.Join(q.dir, fe.Name())
				if pos%(U*cqUnitSize) != 0 {
					return fmt.Errorf("consume queue file %s is not at a multiple of %d units (was ConsumeQueueUnits changed?): %w", path, U, ErrCorrupt)
				}
				f, err := s.fs.OpenFile(path, os.O_RDWR, 0)
				if err != nil {
					return fmt.Errorf("open consume queue file %s: %w", path, err)
				}
				q.files = append(q.files, &cqFile{start: pos / cqUnitSize, path: path, f: f})
			}
			if err := s.trimQueueTail(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// trimQueueTail sets q.max from its last file, dropping a partial trailing unit, the zeros
// after the last unit and empty trailing files.
func (s *Store) trimQueueTail(q *consumeQueue) error {
	buf := make([]byte, 64<<10/cqUnitSize*cqUnitSize)
	for len(q.files) > 0 {
		f := q.files[len(q.files)-1]
		fi, err := f.f.Stat()
		if err != nil {
			return fmt.Errorf("stat consume queue file %s: %w", f.path, err)
		}
		n := min(fi.Size()/cqUnitSize, q.units)
		// Backwards in chunks: a file written through a mapping is full size, all zeros
		// past its last unit (see mapCQFile). Those zeros are unused space, not units
		// (RecoveryReport.RemovedUnits does not count them).
		for n > 0 {
			k := min(n, int64(len(buf)/cqUnitSize))
			b := buf[:k*cqUnitSize]
			if _, err := f.f.ReadAt(b, (n-k)*cqUnitSize); err != nil {
				return readFailure(&s.readErrors, fmt.Errorf("read consume queue file %s at %d: %w", f.path, (n-k)*cqUnitSize, err))
			}
			j := k
			for j > 0 {
				if _, size, _ := decodeUnit(b[(j-1)*cqUnitSize:]); size > 0 {
					break
				}
				j--
			}
			n -= k - j
			if j > 0 {
				break
			}
		}
		if n == 0 && len(q.files) > 1 {
			f.close(-1)
			if err := s.fs.Remove(f.path); err != nil {
				return fmt.Errorf("remove empty consume queue file %s: %w", f.path, err)
			}
			q.files = q.files[:len(q.files)-1]
			continue
		}
		if fi.Size() != n*cqUnitSize {
			if err := f.f.Truncate(n * cqUnitSize); err != nil {
				return fmt.Errorf("truncate consume queue file %s: %w", f.path, err)
			}
		}
		q.min.Store(q.files[0].start)
		q.max.Store(f.start + n)
		return nil
	}
	return nil
}

// truncateQueue drops the units of q that point at or past end (the commit log was cut or
// lost its unsynced tail) and returns how many it dropped.
func (s *Store) truncateQueue(q *consumeQueue, end int64) (int64, error) {
	hi := q.max.Load()
	lo := q.min.Load()
	newMax := hi
	for newMax > lo {
		off, size, _, err := q.unitAt(newMax - 1)
		if err != nil && !errors.Is(err, ErrNotFound) {
			// A unit that cannot be read may well be good: cutting it would lose its message.
			return 0, fmt.Errorf("cut consume queue %s/%d: %w", q.topic, q.qid, err)
		}
		if err == nil && size > 0 && off+int64(size) <= end {
			break
		}
		newMax--
	}
	if newMax == hi {
		return 0, nil
	}
	q.max.Store(newMax)
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.files) > 0 {
		f := q.files[len(q.files)-1]
		if f.start >= newMax && len(q.files) > 1 {
			f.close(-1)
			if err := s.fs.Remove(f.path); err != nil {
				return 0, fmt.Errorf("remove consume queue file %s: %w", f.path, err)
			}
			q.files = q.files[:len(q.files)-1]
			continue
		}
		if err := f.f.Truncate(max(0, newMax-f.start) * cqUnitSize); err != nil {
			return 0, fmt.Errorf("truncate consume queue file %s: %w", f.path, err)
		}
		f.dirty.Store(true)
		break
	}
	if newMax < lo {
		q.min.Store(newMax)
	}
	return hi - newMax, nil
}

// correctMinOffset moves q.min to the first unit whose message is at or after clMin (the
// commit log's first segment): units below point at removed segments. A unit it cannot
// read fails it, q.min unchanged: moving past the unit could hide a live message.
func (s *Store) correctMinOffset(q *consumeQueue, clMin int64) error {
	lo, hi := q.min.Load(), q.max.Load()
	if lo >= hi {
		return nil
	}
	live := func(idx int64) (bool, error) {
		off, size, _, err := q.unitAt(idx)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return false, fmt.Errorf("min offset of consume queue %s/%d: %w", q.topic, q.qid, err)
		}
		return err == nil && size > 0 && off >= clMin, nil
	}
	if ok, err := live(lo); ok || err != nil {
		return err
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := live(mid)
		if err != nil {
			return err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	q.min.Store(lo)
	return nil
}
