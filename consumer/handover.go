package consumer

import (
	"context"
	"errors"
	"slices"
	"time"
)

// handover is a dropped queue whose final commit failed: the offset to commit, and until when
// that offset is still ours to write (the validity our lock on the queue had when it was
// dropped; zero for a queue read without a lock).
type handover struct {
	offset int64
	until  time.Time
}

func (h handover) valid(now time.Time) bool { return h.until.IsZero() || now.Before(h.until) }

// release hands detached queues over: it commits the offset past what Poll handed out (or,
// without auto-commit, the offset the user committed last), and only once that is stored
// releases their locks. A queue whose commit fails keeps its lock and is retried by
// retryHandovers while the lock is valid, so that the next owner does not start from a stale
// offset.
func (l *LitePull) release(ctx context.Context, qs []*queue) error {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	now := time.Now()
	offsets := map[MessageQueue]int64{}
	until := map[MessageQueue]time.Time{}
	var unlock []MessageQueue
	l.mu.Lock()
	for _, q := range qs {
		lockOK := !q.lockTried || (q.locked && now.Before(q.lockValidUntil))
		if q.active && lockOK {
			switch {
			case l.cfg.autoCommit && q.consumeOffset != q.persisted && q.admitLocked(q.consumeOffset):
				offsets[q.mq] = q.consumeOffset
			case !l.cfg.autoCommit && q.committed >= 0 && q.committed != q.persisted && q.admitLocked(q.committed):
				offsets[q.mq] = q.committed
			}
			if q.lockTried {
				until[q.mq] = q.lockValidUntil
			}
		}
		if q.lockTried {
			unlock = append(unlock, q.mq)
		}
	}
	l.mu.Unlock()
	var errs []error
	failed := l.store.persist(ctx, offsets)
	if len(failed) > 0 {
		l.mu.Lock()
		for mq, err := range failed {
			l.handover[mq] = handover{offset: offsets[mq], until: until[mq]}
			errs = append(errs, err)
		}
		l.mu.Unlock()
		unlock = slices.DeleteFunc(unlock, func(mq MessageQueue) bool { return failed[mq] != nil })
	}
	if err := l.unlock(ctx, unlock); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// retryHandovers commits and releases the queues whose hand-over failed earlier. A hand-over
// whose lock lapsed is abandoned without committing: the queue may have a new owner by now,
// whose offsets must not be overwritten with older ones. (Its new owner then starts from the
// offset committed last, and may hand out again what this member handed out since.)
func (l *LitePull) retryHandovers(ctx context.Context) {
	now := time.Now()
	offsets := map[MessageQueue]int64{}
	var abandoned []MessageQueue
	l.mu.Lock()
	for mq, h := range l.handover {
		if h.valid(now) {
			offsets[mq] = h.offset
		} else {
			delete(l.handover, mq)
			abandoned = append(abandoned, mq)
		}
	}
	l.mu.Unlock()
	if len(abandoned) > 0 {
		l.log.Error("hand-over abandoned: the final offset could not be committed while the queue lock was valid", "queues", queueIDs(abandoned))
	}
	if len(offsets) == 0 && len(abandoned) == 0 {
		return
	}
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	failed := l.store.persist(ctx, offsets)
	done := abandoned
	l.mu.Lock()
	for mq, off := range offsets {
		if failed[mq] == nil && l.handover[mq].offset == off {
			delete(l.handover, mq)
			done = append(done, mq)
		}
	}
	l.mu.Unlock()
	if l.cfg.handoverLocks {
		if err := l.unlock(ctx, done); err != nil {
			l.log.Warn("unlock after hand-over failed", "err", err)
		}
	}
}
