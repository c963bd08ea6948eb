package store

import (
	"errors"
	"fmt"
	"time"
)

// cleanLoop runs retention every CleanInterval.
func (s *Store) cleanLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.CleanInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := s.clean(); err != nil {
				s.log.Error("retention failed", "err", err)
			}
		case <-s.stop:
			return
		}
	}
}

// clean deletes the oldest segments that are past Retention, or while the volume is fuller
// than MaxDiskUsage, then the consume-queue files that only point into deleted segments.
//
// # Notes
//
//   - The active segment is never deleted, nor any segment not yet fsynced and dispatched:
//     the flusher and the dispatcher may still need it.
//   - Segments go oldest first and stop at the first one that is kept, so the log stays
//     contiguous. A segment's age is its modification time, i.e. its last message's.
//   - Readers racing with a deletion get ErrNotFound from the closed file and answer
//     MESSAGE_WAS_REMOVING; consume-queue min offsets then move forward. A segment with
//     regions pinned by pulls being sent (GetRegions) is unlinked at once but closed only
//     when the last of them is released, so a send in progress finishes with the right bytes.
func (s *Store) clean() error {
	now := s.opts.Now()
	limit := min(s.flushed.Load(), s.dispatched.Load())
	S := s.opts.SegmentSize
	s.segMu.RLock()
	segs := append([]*segment(nil), s.segs...)
	s.segMu.RUnlock()
	if len(segs) <= 1 {
		return nil
	}
	over := func(freed int64) bool { return false }
	if s.opts.MaxDiskUsage > 0 {
		u, err := s.fs.DiskUsage(s.dir)
		if err != nil {
			s.log.Warn("disk usage unknown; only age-based retention applies", "err", err)
		} else if u.Total > 0 {
			over = func(freed int64) bool {
				used := float64(u.Total-u.Free) - float64(freed)
				return used/float64(u.Total) > s.opts.MaxDiskUsage
			}
		}
	}
	var del []*segment
	var freed int64
	for _, seg := range segs[:len(segs)-1] {
		if seg.start+S > limit {
			break
		}
		fi, err := seg.f.Stat()
		if err != nil {
			return fmt.Errorf("stat segment %s: %w", seg.path, err)
		}
		expired := now.Sub(fi.ModTime()) > s.opts.Retention
		full := over(freed)
		if !expired && !full {
			break
		}
		del = append(del, seg)
		freed += S
		reason := "expired"
		if !expired {
			reason = "disk usage"
		}
		s.log.Info("deleting commit-log segment", "segment", seg.path, "reason", reason, "modified", fi.ModTime())
	}
	if len(del) == 0 {
		return nil
	}
	s.segMu.Lock()
	s.segs = s.segs[len(del):]
	newMin := s.segs[0].start
	s.minOffset.Store(newMin)
	s.segMu.Unlock()
	for _, seg := range del {
		seg.unmap()
		seg.retire() // closed now, or once the last region of it being sent is released
		if err := s.fs.Remove(seg.path); err != nil {
			return fmt.Errorf("remove segment %s: %w", seg.path, err)
		}
	}
	if err := s.fs.SyncDir(s.clDir); err != nil {
		return fmt.Errorf("sync %s: %w", s.clDir, err)
	}
	if err := s.cleanQueues(newMin); err != nil {
		return err
	}
	return s.index.deleteBelow(newMin)
}

// cleanQueues deletes consume-queue files whose every unit points below clMin (never a
// queue's last file) and moves min offsets past units that point below it. A queue whose
// units cannot be read is left as it is (a unit it cannot read is not known to be dead),
// and the failure returned once the other queues are done.
func (s *Store) cleanQueues(clMin int64) error {
	var errs []error
	for _, q := range s.allQueues() {
		if err := s.cleanQueue(q, clMin); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Store) cleanQueue(q *consumeQueue, clMin int64) error {
	for {
		q.mu.RLock()
		if len(q.files) < 2 {
			q.mu.RUnlock()
			break
		}
		f := q.files[0]
		q.mu.RUnlock()
		off, size, _, err := q.unitAt(f.start + q.units - 1)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("clean consume queue %s/%d: %w", q.topic, q.qid, err)
		}
		if err == nil && size > 0 && off >= clMin {
			break
		}
		q.mu.Lock()
		q.files = q.files[1:]
		q.mu.Unlock()
		if q.min.Load() < f.start+q.units {
			q.min.Store(f.start + q.units)
		}
		f.close(-1)
		if err := s.fs.Remove(f.path); err != nil {
			return fmt.Errorf("remove consume queue file %s: %w", f.path, err)
		}
		s.log.Info("deleted consume-queue file", "file", f.path)
	}
	return s.correctMinOffset(q, clMin)
}
