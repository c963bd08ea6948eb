package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"

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
	readsTopic := map[string]bool{} // for this batch: does the group have offsets in the topic?
	for _, q := range ready {
		l.activate(ctx, q, readsTopic)
	}
}

// activate resolves q's start offset and starts its pull task. On failure q stays pending and
// is retried. readsTopic memoizes startOffset's question across one batch of queues.
func (l *LitePull) activate(ctx context.Context, q *queue, readsTopic map[string]bool) {
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
		if stored >= 0 {
			l.mu.Lock()
			l.topicsRead[q.mq.Topic] = true
			l.mu.Unlock()
		}
		if resume != nil && stored == resume.persisted {
			// Nobody committed it while our lock was lost: go on past what we handed out.
			start = resume.consume
		} else if stored < 0 {
			if start, err = l.startOffset(ctx, q.mq, readsTopic); err != nil {
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
	q.pullOffset, q.consumeOffset, q.persisted, q.floor = start, start, stored, -1
	q.active = true
	taskCtx, cancel := context.WithCancel(l.ctx)
	q.taskCancel = cancel
	l.wg.Add(1)
	go l.pullTask(taskCtx, q)
	l.log.Debug("queue active", "queue", q.mq.String(), "offset", start, "stored", stored)
}

// startOffset is where a queue without a stored offset starts, by the consume-from setting.
//
// With ConsumeFromLast, the queue starts at its max offset (only what is written from now on)
// when the group is new to the topic: no queue of the topic has a stored offset. A queue new
// to a group that already reads the topic (the topic gained queues) starts at its first
// message instead, so that nothing written into it before a rebalance reached it is skipped.
// A broker that answers QUERY_CONSUMER_OFFSET with 0 in that case, as RocketMQ's does when
// message 0 is still in memory, is simply obeyed: that 0 is a stored offset. Retry topics
// start at their first message, as in RocketMQ.
func (l *LitePull) startOffset(ctx context.Context, mq MessageQueue, readsTopic map[string]bool) (int64, error) {
	switch {
	case l.cfg.consumeFrom == ConsumeFromFirst, strings.HasPrefix(mq.Topic, retryTopicPrefix):
		return l.queryOffset(ctx, protocol.GetMinOffset, mq)
	case l.cfg.consumeFrom == ConsumeFromTimestamp:
		return l.searchOffset(ctx, mq, l.cfg.consumeTS)
	}
	known, err := l.groupReadsTopic(ctx, mq, readsTopic)
	if err != nil {
		return 0, err
	}
	if known {
		return l.queryOffset(ctx, protocol.GetMinOffset, mq)
	}
	return l.queryOffset(ctx, protocol.GetMaxOffset, mq)
}

// groupReadsTopic reports whether the group has a stored offset for some other queue of mq's
// topic. A yes is remembered for good; a no only in memo (one batch of activations), since the
// group's first commits turn it into a yes.
func (l *LitePull) groupReadsTopic(ctx context.Context, mq MessageQueue, memo map[string]bool) (bool, error) {
	l.mu.Lock()
	known := l.topicsRead[mq.Topic]
	others := slices.Clone(l.topicQueues[mq.Topic])
	l.mu.Unlock()
	if known {
		return true, nil
	}
	if v, ok := memo[mq.Topic]; ok {
		return v, nil
	}
	for _, o := range others {
		if o == mq {
			continue
		}
		off, err := l.store.read(ctx, o)
		if err != nil {
			return false, fmt.Errorf("stored offsets of topic %q: %w", mq.Topic, err)
		}
		if off >= 0 {
			l.mu.Lock()
			l.topicsRead[mq.Topic] = true
			l.mu.Unlock()
			return true, nil
		}
	}
	memo[mq.Topic] = false
	return false, nil
}

// retryTopicPrefix starts the name of a group's retry topic, "%RETRY%<group>": messages sent
// back by the group's members come back through it (RocketMQ's MixAll.RETRY_GROUP_TOPIC_PREFIX).
const retryTopicPrefix = "%RETRY%"
