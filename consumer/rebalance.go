package consumer

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// rebalanceLoop is the only goroutine that adds queues to and removes queues from the owned
// set while the consumer runs. It rebalances when triggered (start, a broker notification, a
// subscription or assignment change, a topic's queues changing) and on the safety-net timer,
// renews held locks, and retries queues still waiting for their lock.
func (l *LitePull) rebalanceLoop() {
	defer l.wg.Done()
	periodic := time.NewTicker(l.cfg.rebalanceInterval)
	defer periodic.Stop()
	var renewC <-chan time.Time
	if l.cfg.handoverLocks {
		renew := time.NewTicker(l.cfg.lockRenew)
		defer renew.Stop()
		renewC = renew.C
	}
	l.renewTick = renewC
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	armed := false
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.rebalanceCh:
			l.rebalance(l.ctx)
		case <-periodic.C:
			l.rebalance(l.ctx)
		case <-renewC:
			l.renewLocks(l.ctx)
			l.acquire(l.ctx)
		case <-retry.C:
			armed = false
			l.mu.Lock()
			settling := l.settling
			l.mu.Unlock()
			if settling {
				l.rebalance(l.ctx)
			} else {
				l.rejoin(l.ctx)
				l.retryHandovers(l.ctx)
				l.acquire(l.ctx)
			}
		}
		if !armed && l.hasPending() {
			retry.Reset(l.cfg.lockRetry)
			armed = true
		}
	}
}

// hasPending reports whether some owned queue is not yet being read, some hand-over still
// has to be committed, locks lapsed with a lost connection still have to be renewed, or the
// group's assignment is still settling.
func (l *LitePull) hasPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.handover) > 0 || l.renewNow || l.settling {
		return true
	}
	for _, q := range l.queues {
		if !q.active {
			return true
		}
	}
	return false
}

// rebalance brings the owned set of every topic in line with what the consumer should own,
// then starts reading the queues it may.
//
// Allocation reads the group's lock table, and members read it at different moments while
// queues change hands, so one rebalance may act on a table another member is changing. The
// consumer therefore allocates again every lock-retry interval until it has read, twice in a
// row, a table that is a fixed point of the strategy (every member holds exactly its share):
// the second read catches a member that acted on an older table meanwhile. The periodic
// rebalance is the safety net beyond that; as every member reads the same table, it
// converges too.
func (l *LitePull) rebalance(ctx context.Context) {
	l.rejoin(ctx)
	l.mu.Lock()
	mode := l.mode
	subs := maps.Clone(l.subs)
	if mode == modeAssign {
		subs = maps.Clone(l.assignSubs) // the queues' selectors (SetAssignSelector)
	}
	assigned := slices.Collect(maps.Keys(l.assigned))
	topicSet := map[string]bool{}
	for mq := range l.queues {
		topicSet[mq.Topic] = true
	}
	l.mu.Unlock()
	for t := range subs {
		if mode != modeAssign {
			topicSet[t] = true
		}
	}
	for _, mq := range assigned {
		topicSet[mq.Topic] = true
	}
	maps.DeleteFunc(l.allocMemo, func(topic string, _ allocMemo) bool { return !topicSet[topic] })
	fromTables, settled, changed := false, true, false
	for _, topic := range slices.Sorted(maps.Keys(topicSet)) {
		var desired []MessageQueue
		switch {
		case mode == modeSubscribe && subs[topic] != nil:
			mine, fromTable, fixed, ok := l.allocate(ctx, topic)
			fromTables, settled = fromTables || fromTable, settled && fixed
			desired = mine
			if !ok {
				continue // keep what we have until we know better
			}
		case mode == modeAssign:
			for _, mq := range assigned {
				if mq.Topic == topic {
					desired = append(desired, mq)
				}
			}
			slices.SortFunc(desired, MessageQueue.Compare)
		}
		if l.reconcile(ctx, topic, desired, subs[topic]) {
			changed = true
		}
	}
	l.mu.Lock()
	switch {
	case !settled:
		l.calmReads = 0
	case fromTables:
		l.calmReads++
	default:
		l.calmReads = settleReads
	}
	if settled || changed {
		l.idleReads = 0
	} else {
		l.idleReads++
	}
	l.settling = l.calmReads < settleReads && l.idleReads < maxIdleReads
	l.mu.Unlock()
	l.retryHandovers(ctx)
	l.acquire(ctx)
	l.rebalances.Add(1)
}

const (
	// settleReads is how many fixed-point reads of the lock table in a row end settling.
	settleReads = 2
	// maxIdleReads is how many reads of a table that is not a fixed point, in a row, with
	// nothing to change on this member's side, end settling too, leaving the rest to the
	// periodic rebalance: a member that does not lock what it reads (a RocketMQ client in
	// the group, or hand-over locks off) keeps the table from ever being one.
	maxIdleReads = 20
)

// rejoin sends the heartbeat a subscription change or a lost connection asked for, so that
// the broker knows this member and its subscriptions before anyone allocates; after a lost
// connection it then renews the locks, which are not trusted until then.
func (l *LitePull) rejoin(ctx context.Context) {
	l.mu.Lock()
	heartbeat, renew := l.needHeartbeat || l.renewNow, l.renewNow
	l.needHeartbeat, l.renewNow = false, false
	l.mu.Unlock()
	if !heartbeat {
		return
	}
	retry := func() { // on the retry timer; the lapsed locks stay lapsed meanwhile
		l.mu.Lock()
		l.renewNow = true
		l.mu.Unlock()
	}
	if err := l.cl.SendHeartbeat(ctx); err != nil {
		if ctx.Err() == nil {
			l.log.Warn("heartbeat failed", "err", err)
		}
		if renew {
			// Renewing before the broker knows us again could be undone by its handling of the
			// old connection's close.
			retry()
		}
		return
	}
	if renew && !l.renewLocks(ctx) {
		retry()
	}
}

// reconcile makes topic's owned queues exactly desired: queues no longer ours stop being handed
// out at once, then are committed and released; new ones wait for acquire. It reports whether
// the owned set changed.
func (l *LitePull) reconcile(ctx context.Context, topic string, desired []MessageQueue, sub *subscription) (changed bool) {
	want := make(map[MessageQueue]bool, len(desired))
	for _, mq := range desired {
		want[mq] = true
	}
	l.mu.Lock()
	var removed []*queue
	for mq, q := range l.queues {
		if mq.Topic == topic && !want[mq] {
			l.detachLocked(q)
			removed = append(removed, q)
		}
	}
	added := 0
	now := time.Now()
	for _, mq := range desired {
		if _, ok := l.queues[mq]; ok {
			continue
		}
		q := newQueue(mq, sub)
		if h, ok := l.handover[mq]; ok {
			// Back before its hand-over completed. While our lock on it is valid nobody else
			// read it, and the offset we failed to commit is where it stands; after that,
			// another member may have read and committed it further: ask the store.
			if h.valid(now) {
				q.seekOffset = h.offset
			}
			delete(l.handover, mq)
		}
		l.queues[mq] = q
		added++
	}
	changed = len(removed) > 0 || added > 0
	if changed {
		l.rebuildOrderLocked()
	}
	l.mu.Unlock()
	if len(removed) > 0 {
		l.revoke(ctx, removed)
		if err := l.release(ctx, removed); err != nil {
			l.log.Warn("rebalance: hand-over incomplete, will retry", "topic", topic, "err", err)
		}
	}
	if changed {
		l.log.Info("assignment changed", "topic", topic, "queues", queueIDs(desired), "added", added, "removed", len(removed))
		if fn := l.cfg.queueListener; fn != nil {
			fn(topic, slices.Clone(desired))
		}
	}
	return changed
}

func queueIDs(qs []MessageQueue) []string {
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = fmt.Sprintf("%s/%d", q.BrokerName, q.QueueID)
	}
	return out
}

// rebuildOrderLocked rebuilds the Poll rotation from the owned set.
func (l *LitePull) rebuildOrderLocked() {
	l.order = slices.SortedFunc(maps.Values(l.queues), func(a, b *queue) int { return a.mq.Compare(b.mq) })
	if len(l.order) > 0 {
		l.cursor %= len(l.order)
	} else {
		l.cursor = 0
	}
}

// detachLocked stops q at once: nothing more of it is cached or handed out, its pull task
// ends, and it leaves the owned set. Its offsets stay in q for release.
func (l *LitePull) detachLocked(q *queue) {
	q.dropped = true
	if q.taskCancel != nil {
		q.taskCancel()
	}
	q.skipEmptyLocked()
	l.clearCacheLocked(q)
	if l.queues[q.mq] == q {
		delete(l.queues, q.mq)
		delete(l.failures, q.mq)
	}
}

// revoke tells the application (WithOnQueuesRevoked) that the detached queues qs, those it
// had started reading, are about to be handed over: it may still commit them meanwhile.
func (l *LitePull) revoke(ctx context.Context, qs []*queue) {
	fn := l.cfg.onRevoked
	if fn == nil {
		return
	}
	var mqs []MessageQueue
	l.mu.Lock()
	for _, q := range qs {
		if q.active {
			l.revoking[q.mq] = q
			mqs = append(mqs, q.mq)
		}
	}
	l.mu.Unlock()
	if len(mqs) == 0 {
		return
	}
	slices.SortFunc(mqs, MessageQueue.Compare)
	defer func() {
		l.mu.Lock()
		for _, mq := range mqs {
			delete(l.revoking, mq)
		}
		l.mu.Unlock()
	}()
	fn(ctx, mqs)
}
