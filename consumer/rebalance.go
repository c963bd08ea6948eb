package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
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
			l.rejoin(l.ctx)
			l.retryHandovers(l.ctx)
			l.acquire(l.ctx)
		}
		if !armed && l.hasPending() {
			retry.Reset(l.cfg.lockRetry)
			armed = true
		}
	}
}

// hasPending reports whether some owned queue is not yet being read, some hand-over still
// has to be committed, or locks lapsed with a lost connection still have to be renewed.
func (l *LitePull) hasPending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.handover) > 0 || l.renewNow {
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
func (l *LitePull) rebalance(ctx context.Context) {
	l.rejoin(ctx)
	l.mu.Lock()
	mode := l.mode
	subs := maps.Clone(l.subs)
	assigned := slices.Collect(maps.Keys(l.assigned))
	topicSet := map[string]bool{}
	for mq := range l.queues {
		topicSet[mq.Topic] = true
	}
	l.mu.Unlock()
	for t := range subs {
		topicSet[t] = true
	}
	for _, mq := range assigned {
		topicSet[mq.Topic] = true
	}
	for _, topic := range slices.Sorted(maps.Keys(topicSet)) {
		var desired []MessageQueue
		switch {
		case mode == modeSubscribe && subs[topic] != nil:
			var ok bool
			if desired, ok = l.allocate(ctx, topic); !ok {
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
		l.reconcile(ctx, topic, desired, subs[topic])
	}
	l.retryHandovers(ctx)
	l.acquire(ctx)
}

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

// allocate computes this member's share of topic. ok is false when an input could not be
// had, in which case the current assignment stands.
func (l *LitePull) allocate(ctx context.Context, topic string) (mine []MessageQueue, ok bool) {
	r, err := l.cl.Route(ctx, topic)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("rebalance: no route", "topic", topic, "err", err)
		}
		return nil, false
	}
	l.setTopicQueues(topic, r.SubscribeQueues, true)
	queues := r.SubscribeQueues
	if len(queues) == 0 {
		return nil, true
	}
	if l.cfg.model == Broadcasting {
		return slices.Clone(queues), true
	}
	me := l.ClientID()
	cids, err := l.consumerIDs(ctx, r.BrokerAddrs())
	if err == nil && !slices.Contains(cids, me) {
		// The broker lost us (restart, expiry) or has not seen our first heartbeat: register
		// and ask again rather than give every queue away.
		if herr := l.cl.SendHeartbeat(ctx); herr == nil {
			cids, err = l.consumerIDs(ctx, r.BrokerAddrs())
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("rebalance: no member list", "topic", topic, "err", err)
		}
		return nil, false
	}
	if len(cids) == 0 {
		return nil, true
	}
	l.mu.Lock()
	prev := l.previous[topic]
	l.mu.Unlock()
	for _, cid := range cids {
		if _, ok := prev[cid]; !ok {
			// A member this one has no history for has no history of its own either (a
			// joiner): every member must allocate from the same Previous, so nobody uses one.
			prev = nil
			break
		}
	}
	req := allocate.Request{Group: l.group, ClientID: me, Queues: queues, ClientIDs: cids, Previous: prev}
	mine, err = l.cfg.strategy.Allocate(ctx, req)
	if err != nil {
		l.log.Error("rebalance: allocation failed", "topic", topic, "strategy", l.cfg.strategy.Name(), "err", err)
		return nil, false
	}
	// Record the whole group's allocation, so that the next rebalance can pass it as
	// Previous: every member computes the same map from the same inputs.
	full := make(map[string][]MessageQueue, len(cids))
	for _, cid := range cids {
		req.ClientID = cid
		if share, err := l.cfg.strategy.Allocate(ctx, req); err == nil {
			full[cid] = share
		}
	}
	l.mu.Lock()
	l.previous[topic] = full
	l.mu.Unlock()
	slices.SortFunc(mine, MessageQueue.Compare)
	return slices.Compact(mine), true
}

// consumerIDs asks the brokers, in turn, for the group's members, sorted.
func (l *LitePull) consumerIDs(ctx context.Context, addrs []string) ([]string, error) {
	var errs []error
	h := protocol.GetConsumerListByGroupRequestHeader{ConsumerGroup: l.group}
	for _, addr := range addrs {
		resp, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.GetConsumerListByGroup, &h, nil))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var body protocol.ConsumerListBody
		if err := protocol.UnmarshalBody(resp.Body, &body); err != nil {
			errs = append(errs, fmt.Errorf("consumer list from %s: %w", addr, err))
			continue
		}
		ids := slices.DeleteFunc(body.ConsumerIDList, func(s string) bool { return s == "" })
		slices.Sort(ids)
		return slices.Compact(ids), nil
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("consumer list of %q: no broker known to ask", l.group)
	}
	return nil, fmt.Errorf("consumer list of %q: %w", l.group, errors.Join(errs...))
}

// reconcile makes topic's owned queues exactly desired: queues no longer ours stop being handed
// out at once, then are committed and released; new ones wait for acquire.
func (l *LitePull) reconcile(ctx context.Context, topic string, desired []MessageQueue, sub *subscription) {
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
	changed := len(removed) > 0 || added > 0
	if changed {
		l.rebuildOrderLocked()
	}
	l.mu.Unlock()
	if len(removed) > 0 {
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
	}
}

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
			case l.cfg.autoCommit && q.consumeOffset != q.persisted:
				offsets[q.mq] = q.consumeOffset
			case !l.cfg.autoCommit && q.committed >= 0 && q.committed != q.persisted:
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

// byBroker groups queues by broker name.
func byBroker(mqs []MessageQueue) map[string][]MessageQueue {
	out := map[string][]MessageQueue{}
	for _, mq := range mqs {
		out[mq.BrokerName] = append(out[mq.BrokerName], mq)
	}
	return out
}

// lockRequest sends code (LOCK_BATCH_MQ or UNLOCK_BATCH_MQ) for mqs to their brokers, one
// request per broker, waiting for each answer, and passes each successful answer to answer.
func (l *LitePull) lockRequest(ctx context.Context, code protocol.RequestCode, mqs []MessageQueue, answer func(addr string, resp *protocol.Command) error) error {
	var errs []error
	for name, group := range byBroker(mqs) {
		addr, err := l.cl.FindBrokerAddr(ctx, name, group[0].Topic)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s of %d queues: %w", code, len(group), err))
			continue
		}
		body, err := protocol.MarshalBody(&protocol.LockBatchRequestBody{ConsumerGroup: l.group, ClientID: l.ClientID(), MQSet: group})
		if err != nil {
			return fmt.Errorf("%s: %w", code, err)
		}
		resp, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequest(code, nil, body))
		if err == nil && answer != nil {
			err = answer(addr, resp)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s of %d queues on %s: %w", code, len(group), name, err))
		}
	}
	return errors.Join(errs...)
}

// unlock releases the broker locks of mqs (UNLOCK_BATCH_MQ), waiting for each answer.
func (l *LitePull) unlock(ctx context.Context, mqs []MessageQueue) error {
	return l.lockRequest(ctx, protocol.UnlockBatchMQ, mqs, nil)
}

// lock asks the brokers for the locks of mqs (LOCK_BATCH_MQ) and returns the queues held, the
// time the requests were sent (the lease runs from no earlier than that), and the lock epoch
// before they were sent: an answer that crossed a lost connection (the epoch moved on) is
// not to be trusted.
func (l *LitePull) lock(ctx context.Context, mqs []MessageQueue) (held map[MessageQueue]bool, sent time.Time, epoch uint64, err error) {
	l.mu.Lock()
	epoch = l.lockEpoch
	l.mu.Unlock()
	sent = time.Now()
	held = map[MessageQueue]bool{}
	err = l.lockRequest(ctx, protocol.LockBatchMQ, mqs, func(addr string, resp *protocol.Command) error {
		var out protocol.LockBatchResponseBody
		if err := protocol.UnmarshalBody(resp.Body, &out); err != nil {
			return fmt.Errorf("answer from %s: %w", addr, err)
		}
		for _, mq := range out.LockOKMQSet {
			held[mq] = true
		}
		return nil
	})
	return held, sent, epoch, err
}

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
	seek := q.seekOffset
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
		if stored < 0 {
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

// renewLocks renews the locks of the queues being read. A queue whose lock the broker gives to
// someone else (our lease ran out, or our connection closed) is dropped without committing
// (its offset is no longer ours to write) and waits to be locked again. It reports false when
// the brokers could not be asked.
func (l *LitePull) renewLocks(ctx context.Context) bool {
	l.mu.Lock()
	if !l.lockedMode() {
		l.mu.Unlock()
		return true
	}
	var held []MessageQueue
	for _, q := range l.order {
		if q.locked && !q.dropped {
			held = append(held, q.mq)
		}
	}
	l.mu.Unlock()
	if len(held) == 0 {
		return true
	}
	got, sent, epoch, err := l.lock(ctx, held)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("lock renewal failed", "err", err)
		}
		return false // the locks lapse locally at half the lease; a later renewal may still save them
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lockEpoch != epoch {
		// A connection was lost meanwhile: the answer is not to be trusted. ConnectionLost
		// asked for another renewal if it concerned a lock held; the others keep their
		// validity until the next renewal.
		return true
	}
	defer l.wakePollersLocked() // queues whose lock had lapsed may have cached messages
	lost := false
	for _, mq := range held {
		q, ok := l.queues[mq]
		if !ok || q.dropped || !q.locked {
			continue
		}
		if got[mq] {
			q.lockValidUntil = sent.Add(l.cfg.lockLease / 2)
			continue
		}
		l.log.Warn("queue lock lost to another member", "queue", mq.String())
		l.detachLocked(q)
		l.queues[mq] = newQueue(mq, q.sub)
		lost = true
	}
	if lost {
		l.rebuildOrderLocked()
	}
	return true
}
