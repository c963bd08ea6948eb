package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// Commit commits, for every owned queue, the offset past the messages Poll has handed out.
func (l *LitePull) Commit(ctx context.Context) error {
	if err := l.checkRunning(); err != nil {
		return err
	}
	if l.cfg.reader {
		return fmt.Errorf("commit: %w", ErrReadOnly)
	}
	return l.commitAll(ctx, false)
}

// commitAll persists the consume offset of every owned, active queue (whose lock is still
// valid); onlyChanged skips those already persisted.
func (l *LitePull) commitAll(ctx context.Context, onlyChanged bool) error {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	now := time.Now()
	offsets := map[MessageQueue]int64{}
	l.mu.Lock()
	for mq, q := range l.queues {
		if !q.active || q.dropped || (l.lockedMode() && !(q.locked && now.Before(q.lockValidUntil))) {
			continue
		}
		q.skipEmptyLocked()
		if onlyChanged && q.consumeOffset == q.persisted || !q.admitLocked(q.consumeOffset) {
			continue
		}
		q.committed = q.consumeOffset
		offsets[mq] = q.consumeOffset
	}
	l.mu.Unlock()
	return l.persistLocked(ctx, offsets)
}

// persistLocked writes offsets to the store and records them as persisted. commitMu is held:
// for writing, or for reading together with the commit locks of offsets' queues.
func (l *LitePull) persistLocked(ctx context.Context, offsets map[MessageQueue]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	failed := l.store.persist(ctx, offsets)
	l.mu.Lock()
	for mq, off := range offsets {
		if q, ok := l.ownedLocked(mq); ok && failed[mq] == nil {
			q.persisted = off
		}
	}
	l.mu.Unlock()
	if len(failed) == 0 {
		return nil
	}
	errs := make([]error, 0, len(failed))
	for _, err := range failed {
		errs = append(errs, err)
	}
	return fmt.Errorf("commit offsets of %d queues: %w", len(failed), errors.Join(errs...))
}

// CommitOffsets commits the given offsets of owned queues, and of queues being revoked while
// the WithOnQueuesRevoked function runs (also during Close). A queue not owned fails the
// whole call with ErrNotAssigned before anything is committed.
//
// A queue's committed offset only moves forward: an offset below one this consumer already
// sent for the queue (since it started reading it, or since the last Seek of it) is not
// sent, so concurrent calls leave the highest offset stored whatever order they ran in. To
// go back, Seek first. Calls for different queues go to the broker at the same time: a slow
// commit of one queue holds up the commits of that queue only.
func (l *LitePull) CommitOffsets(ctx context.Context, offsets map[MessageQueue]int64) error {
	if l.cfg.reader {
		return fmt.Errorf("commit offsets: %w", ErrReadOnly)
	}
	runErr := l.checkRunning()
	l.commitMu.RLock()
	defer l.commitMu.RUnlock()
	defer l.lockCommits(offsets)()
	now := time.Now()
	l.mu.Lock()
	for mq, off := range offsets {
		q, ok := l.revoking[mq]
		if !ok && runErr == nil {
			q, ok = l.queues[mq]
		}
		if !ok && runErr != nil {
			l.mu.Unlock()
			return runErr
		}
		if !ok || !q.active || (l.lockedMode() && !(q.locked && now.Before(q.lockValidUntil))) {
			// Not ours, or our lock on it may have lapsed: its offset may be another
			// member's to write.
			l.mu.Unlock()
			return fmt.Errorf("commit %s: %w", mq, ErrNotAssigned)
		}
		if off < 0 {
			l.mu.Unlock()
			return fmt.Errorf("commit %s: %w: negative offset %d", mq, ErrInvalidArgument, off)
		}
	}
	send := make(map[MessageQueue]int64, len(offsets))
	for mq, off := range offsets {
		q, _ := l.ownedLocked(mq)
		if q.admitLocked(off) {
			q.committed = off
			send[mq] = off
		}
	}
	l.mu.Unlock()
	return l.persistLocked(ctx, send)
}

// queueCommit orders the commits of one queue made by concurrent CommitOffsets calls; refs
// counts the calls holding or waiting for it, so that LitePull.commits keeps only queues
// being committed.
type queueCommit struct {
	mu   sync.Mutex
	refs int // guarded by LitePull.mu
}

// lockCommits takes the commit locks of offsets' queues, in the queues' order (so that two
// calls never wait for each other), and returns the function that releases them.
func (l *LitePull) lockCommits(offsets map[MessageQueue]int64) (unlock func()) {
	mqs := slices.SortedFunc(maps.Keys(offsets), MessageQueue.Compare)
	locks := make([]*queueCommit, len(mqs))
	l.mu.Lock()
	for i, mq := range mqs {
		qc := l.commits[mq]
		if qc == nil {
			qc = &queueCommit{}
			l.commits[mq] = qc
		}
		qc.refs++
		locks[i] = qc
	}
	l.mu.Unlock()
	for _, qc := range locks {
		qc.mu.Lock()
	}
	return func() {
		for _, qc := range locks {
			qc.mu.Unlock()
		}
		l.mu.Lock()
		for i, mq := range mqs {
			if locks[i].refs--; locks[i].refs == 0 {
				delete(l.commits, mq)
			}
		}
		l.mu.Unlock()
	}
}

// Committed returns the offset stored for mq (on the broker, or in the local file in
// broadcasting), or -1 when there is none.
func (l *LitePull) Committed(ctx context.Context, mq MessageQueue) (int64, error) {
	if err := l.checkRunning(); err != nil {
		return 0, err
	}
	off, err := l.store.read(ctx, mq)
	if err != nil {
		return 0, fmt.Errorf("committed offset of %s: %w", mq, err)
	}
	return off, nil
}

// Position returns the consume offset of an owned queue that is being read: the offset past
// the messages Poll has handed out and past the messages the broker skipped after them
// (filtered out by the subscription). A manual-commit application that has processed
// everything Poll returned can commit it, so that a queue whose messages the filter rejects
// does not stay behind. It fails with ErrNotAssigned for a queue not owned or not read yet.
func (l *LitePull) Position(mq MessageQueue) (int64, error) {
	if err := l.checkRunning(); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	q, ok := l.queues[mq]
	if !ok || !q.active || q.dropped {
		return 0, fmt.Errorf("position of %s: %w", mq, ErrNotAssigned)
	}
	q.skipEmptyLocked()
	return q.consumeOffset, nil
}

// autoCommit commits changed offsets (every auto-commit interval).
func (l *LitePull) autoCommit() {
	if err := l.commitAll(l.ctx, true); err != nil && l.ctx.Err() == nil {
		l.log.Warn("auto-commit failed", "err", err)
	}
}

// ownedLocked returns the state of mq if it is being revoked or owned.
func (l *LitePull) ownedLocked(mq MessageQueue) (*queue, bool) {
	if q, ok := l.revoking[mq]; ok {
		return q, true
	}
	q, ok := l.queues[mq]
	return q, ok
}
