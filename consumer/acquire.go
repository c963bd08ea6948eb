package consumer

import (
	"context"
	"fmt"

	"github.com/flowd-io/flowd/protocol"
)

// acquire starts reading the owned queues that are not read yet: with hand-over locks, those
// whose lock it gets (the others are retried); the start offset is read only after the lock
// is held, so that it includes the previous owner's final commit.
func (l *LitePull) acquire(ctx context.Context) {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		return
	}
	locked := l.lockedMode()
	var pending []*queue
	for _, q := range l.order {
		if !q.active && !q.dropped {
			pending = append(pending, q)
		}
	}
	l.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	ready := pending
	if locked {
		mqs := make([]MessageQueue, len(pending))
		for i, q := range pending {
			mqs[i] = q.mq
		}
		held, sent, epoch, err := l.lock(ctx, mqs)
		if err != nil && ctx.Err() == nil {
			l.log.Warn("lock request failed", "err", err)
		}
		ready = ready[:0:0]
		var waiting []string
		l.mu.Lock()
		trusted := l.lockEpoch == epoch
		for _, q := range pending {
			q.lockTried = true
			if held[q.mq] && trusted {
				q.locked, q.lockValidUntil = true, sent.Add(l.cfg.lockLease/2)
				ready = append(ready, q)
			} else {
				waiting = append(waiting, fmt.Sprintf("%s/%d", q.mq.BrokerName, q.mq.QueueID))
			}
		}
		l.mu.Unlock()
		if len(waiting) > 0 {
			l.log.Debug("queues still held by their previous owner", "queues", waiting)
		}
	}
	for _, q := range ready {
		l.activate(ctx, q)
	}
}

// activate resolves q's start offset and starts its pull task. On failure q stays pending and
// is retried.
func (l *LitePull) activate(ctx context.Context, q *queue) {
	l.mu.Lock()
	seek, resume := q.seekOffset, q.resume
	l.mu.Unlock()
	start, stored := seek, int64(-1)
	if seek < 0 {
		var err error
		if stored, err = l.store.read(ctx, q.mq); err != nil {
			if ctx.Err() == nil {
				l.log.Warn("cannot read stored offset", "queue", q.mq.String(), "err", err)
			}
			return
		}
		start = stored
		if resume != nil && stored == resume.persisted {
			// Nobody committed it while our lock was lost: go on past what we handed out.
			start = resume.consume
		} else if stored < 0 {
			if start, err = l.startOffset(ctx, q.mq); err != nil {
				if ctx.Err() == nil {
					l.log.Warn("cannot compute start offset", "queue", q.mq.String(), "err", err)
				}
				return
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q.dropped || l.closing || l.queues[q.mq] != q {
		return
	}
	if q.seekOffset >= 0 {
		start = q.seekOffset // a seek arrived while we were asking
	}
	q.seekOffset = -1
	q.pullOffset, q.consumeOffset, q.persisted = start, start, stored
	q.active = true
	taskCtx, cancel := context.WithCancel(l.ctx)
	q.taskCancel = cancel
	l.wg.Add(1)
	go l.pullTask(taskCtx, q)
	l.log.Debug("queue active", "queue", q.mq.String(), "offset", start, "stored", stored)
}

// startOffset is where a queue without a stored offset starts, by the consume-from setting.
func (l *LitePull) startOffset(ctx context.Context, mq MessageQueue) (int64, error) {
	switch l.cfg.consumeFrom {
	case ConsumeFromFirst:
		return l.queryOffset(ctx, protocol.GetMinOffset, mq)
	case ConsumeFromTimestamp:
		return l.searchOffset(ctx, mq, l.cfg.consumeTS)
	}
	return l.queryOffset(ctx, protocol.GetMaxOffset, mq)
}
