package store

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// flushWaiter is an append waiting, in FlushSync mode, for the fsync that covers it: the
// end of its bytes in the commit log, when it stops waiting, and whom to tell. Exactly one
// of one, many and ch is set.
type flushWaiter struct {
	end      int64
	deadline time.Time
	res      PutResult   // one's result
	ress     []PutResult // many's results
	one      func(PutResult, error)
	many     func([]PutResult, error)
	ch       chan error // Put and PutBatch: buffered, one value
}

// complete tells the waiter's owner; host is the store's, for the message ids, which are
// made here rather than under the append lock.
func (w *flushWaiter) complete(err error, host netip.AddrPort) {
	switch {
	case w.one != nil:
		w.res.MsgID = protocol.OffsetMsgID(host, w.res.CommitLogOffset)
		w.one(w.res, err)
	case w.many != nil:
		for i := range w.ress {
			w.ress[i].MsgID = protocol.OffsetMsgID(host, w.ress[i].CommitLogOffset)
		}
		w.many(w.ress, err)
	default:
		w.ch <- err
	}
}

// PutAsync is Put that does not wait: it appends m as Put does and calls done with where m
// went once m is acknowledged. In FlushAsync mode that is at once, before PutAsync returns,
// on the calling goroutine. In FlushSync mode it is once an fsync covers m, or with an error
// wrapping ErrFlushTimeout after Options.SyncFlushTimeout (m is stored, but not known
// durable), called by the store's group-commit goroutine; then no goroutine waits for m.
// An error that stops the append (a bad topic, a closed or failed store) is also passed to
// done on the calling goroutine, with a zero PutResult.
//
// done is called exactly once. Calls for messages appended one after the other come in
// the order of the appends. done runs on the store's group-commit goroutine (or, for the
// last ones, on the goroutine calling Close), which completes every message an fsync
// covered in one sweep: it must be quick and must not block (hand the answer to a queue,
// as remoting.Deferred.Respond does), and must not call Close.
//
// ctx is only consulted before the append: once appended, the wait ends with the fsync,
// the timeout, the store's failure or its Close (ErrClosed when the final flush did not
// cover m).
//
// # Notes
//
// Until done is called, m's result and done are held by the store (about 100 bytes).
func (s *Store) PutAsync(ctx context.Context, m *protocol.MessageExt, done func(PutResult, error)) {
	if err := ctx.Err(); err != nil {
		done(PutResult{}, fmt.Errorf("put to %q: %w", m.Topic, err))
		return
	}
	bp := s.getEncBuf()
	defer s.putEncBuf(bp)
	b, err := s.encode((*bp)[:0], m)
	*bp = b
	if err != nil {
		done(PutResult{}, err)
		return
	}
	ms := [1]*protocol.MessageExt{m}
	w := flushWaiter{one: done}
	var res [1]PutResult
	waiting, err := s.appendWait(ms[:], b, res[:], &w)
	switch {
	case err != nil:
		done(PutResult{}, err)
	case !waiting: // res is ours only when no waiter was queued with it
		res[0].MsgID = protocol.OffsetMsgID(s.opts.StoreHost, res[0].CommitLogOffset)
		done(res[0], nil)
	}
}

// PutBatchAsync is PutBatch that does not wait: it appends ms as PutBatch does (all or
// none, contiguously) and calls done with their results once they are acknowledged, by
// PutAsync's rules. An error that stops the append comes with nil results.
func (s *Store) PutBatchAsync(ctx context.Context, ms []*protocol.MessageExt, done func([]PutResult, error)) {
	if len(ms) == 0 {
		done(nil, nil)
		return
	}
	if err := ctx.Err(); err != nil {
		done(nil, fmt.Errorf("put batch to %q: %w", ms[0].Topic, err))
		return
	}
	b, bp, err := s.encodeBatch(ms)
	if bp != nil {
		defer s.putEncBuf(bp)
	}
	if err != nil {
		done(nil, err)
		return
	}
	res := make([]PutResult, len(ms))
	w := flushWaiter{many: done}
	waiting, err := s.appendWait(ms, b, res, &w)
	switch {
	case err != nil:
		done(nil, err)
	case !waiting: // res is ours only when no waiter was queued with it
		for i := range res {
			res[i].MsgID = protocol.OffsetMsgID(s.opts.StoreHost, res[i].CommitLogOffset)
		}
		done(res, nil)
	}
}

// appendWait appends as append does and, in FlushSync mode, queues w (completed with the
// results in res) for the group commit, reporting whether it did. The queue is filled under
// Store.mu, right after the write: waiters are in the order of their end offsets, and each
// is queued before the flusher can see its bytes.
func (s *Store) appendWait(ms []*protocol.MessageExt, b []byte, res []PutResult, w *flushWaiter) (waiting bool, err error) {
	if s.opts.FlushMode != FlushSync {
		_, err := s.append(ms, b, res, nil)
		return false, err
	}
	if _, err := s.append(ms, b, res, w); err != nil {
		return false, err
	}
	signal(s.flushReq)
	return true, nil
}

// enqueueWaiterLocked queues w, whose bytes end at end, for the group commit. Store.mu is
// held.
func (s *Store) enqueueWaiterLocked(w *flushWaiter, end int64, res []PutResult) {
	w.end = end
	// Taken under the lock, so that deadlines, like ends, grow along the queue.
	w.deadline = time.Now().Add(s.opts.SyncFlushTimeout)
	switch {
	case w.one != nil:
		w.res = res[0]
	case w.many != nil:
		w.ress = res
	}
	s.waitMu.Lock()
	first := len(s.waiters) == 0
	s.waiters = append(s.waiters, *w)
	s.waitMu.Unlock()
	if first {
		// The group-commit goroutine arms its timeout timer for the oldest waiter; with
		// waiters queued already it is armed, or the next sweep arms it.
		signal(s.commitReq)
	}
}

// commitLoop is the group commit's completion stage: after every commit-log fsync (and
// when the oldest waiter's timeout comes) it completes, in one sweep and in order, every
// waiting append the fsync covered, and those whose SyncFlushTimeout passed. It runs apart
// from the flusher so that the flusher starts the next fsync while the answers go out.
func (s *Store) commitLoop() {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	var batch []flushWaiter
	for {
		select {
		case <-s.commitReq:
		case <-t.C:
		case <-s.stop:
			return // Close completes what is left, after its final flush
		}
		var next time.Time
		batch, next = s.completeWaiters(batch, false)
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
	}
}

// completeWaiters takes the waiters that are done off the queue (the fsync covered them,
// their timeout passed, the store failed, or, with final, every one: the store is closing)
// and completes them in order. It returns batch for reuse and the deadline of the oldest
// waiter still queued (zero if none).
func (s *Store) completeWaiters(batch []flushWaiter, final bool) ([]flushWaiter, time.Time) {
	flushed := s.flushed.Load()
	failure := s.writeFailure()
	now := time.Now()
	s.waitMu.Lock()
	n := 0
	for n < len(s.waiters) {
		w := &s.waiters[n]
		if w.end > flushed && failure == nil && !final && w.deadline.After(now) {
			break // ends and deadlines both grow along the queue
		}
		n++
	}
	batch = append(batch[:0], s.waiters[:n]...)
	rest := copy(s.waiters, s.waiters[n:])
	clear(s.waiters[rest:])
	s.waiters = s.waiters[:rest]
	var next time.Time
	if rest > 0 {
		next = s.waiters[0].deadline
	}
	s.waitMu.Unlock()
	for i := range batch {
		w := &batch[i]
		var err error
		switch {
		case w.end <= flushed:
		case failure != nil:
			err = failure
		case final:
			err = fmt.Errorf("wait for fsync up to %d: %w", w.end, ErrClosed)
		default:
			err = fmt.Errorf("wait for fsync up to %d: %w", w.end, ErrFlushTimeout)
		}
		w.complete(err, s.opts.StoreHost)
		*w = flushWaiter{} // drop the references held
	}
	return batch[:0], next
}

// awaitDurable is how Put and PutBatch wait, in FlushSync mode, for the waiter they queued
// (ch) to be completed, or for ctx to end.
func (s *Store) awaitDurable(ctx context.Context, ch chan error) error {
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		// The waiter stays queued and is completed into ch (buffered) as usual.
		return fmt.Errorf("wait for fsync: %w", ctx.Err())
	}
}
