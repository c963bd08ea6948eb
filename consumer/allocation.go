package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// allocate computes this member's share of topic. ok is false when an input could not be
// had, in which case the current assignment stands. settled is false while the group's lock
// table is not yet what the strategy makes of it (a hand-over is under way, or members read
// the table at different moments, or a request failed): the caller allocates again soon,
// until it is. fromTable reports whether the lock table was read at all.
//
// The previous assignment passed to the strategy is the group's lock table on the brokers
// (GET_LOCK_OWNERS): with hand-over locks every member locks every queue it reads, so the
// table is the group's current assignment, and every member reads the same one. A member's
// own memory of past rebalances would not do: members that saw different sequences of joins
// and leaves would pass different histories and could leave a queue to nobody. Without
// hand-over locks, or with a broker that does not know the request, no previous assignment
// is passed (sticky strategies then fall back to their inner strategy).
func (l *LitePull) allocate(ctx context.Context, topic string) (mine []MessageQueue, fromTable, settled, ok bool) {
	r, err := l.cl.Route(ctx, topic)
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case isRetryTopic(topic) && errors.Is(err, clientcore.ErrTopicNotExist):
			l.log.Debug("rebalance: no retry topic yet (nothing was sent back)", "topic", topic)
		default:
			l.log.Warn("rebalance: no route", "topic", topic, "err", err)
		}
		// A topic that does not exist is settled as it is; a failed request is tried again.
		return nil, false, errors.Is(err, clientcore.ErrTopicNotExist), false
	}
	l.setTopicQueues(topic, r.SubscribeQueues, true)
	queues := r.SubscribeQueues
	if len(queues) == 0 {
		return nil, false, true, true
	}
	if l.cfg.model == Broadcasting {
		return slices.Clone(queues), false, true, true
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
		return nil, false, false, false
	}
	if len(cids) == 0 {
		return nil, false, true, true
	}
	var prev map[string][]MessageQueue
	var allocators map[string]string
	known := false
	if l.cfg.handoverLocks { // allocate runs for subscriptions only: locked mode
		if prev, allocators, known, err = l.lockOwners(ctx, topic, r.BrokerAddrs()); err != nil {
			if ctx.Err() == nil {
				l.log.Warn("rebalance: no lock table", "topic", topic, "err", err)
			}
			return nil, false, false, false
		}
	}
	strategy, stale := l.agree(me, cids, allocators)
	if stale {
		// The brokers still have the allocator we reported before ours changed (a Wasm
		// allocator's new version became active): tell them, then read again, so that the
		// others see the change before we act on it.
		l.mu.Lock()
		l.needHeartbeat = true
		l.mu.Unlock()
		return nil, false, false, false
	}
	req := allocate.Request{Group: l.group, ClientID: me, Queues: queues, ClientIDs: cids, Previous: prev}
	shares, err := l.groupShares(ctx, topic, strategy, req)
	if err != nil {
		if ctx.Err() == nil {
			l.log.Error("rebalance: allocation failed", "topic", topic, "strategy", strategy.Name(), "err", err)
		}
		return nil, false, true, false
	}
	mine = slices.Clone(shares[me])
	settled = !known || isFixedPoint(req, shares, prev)
	return mine, known, settled, true
}

// allocStatus is what a consumer last learnt of its group's allocators, for its running info.
type allocStatus struct {
	inUse    string // the identity of the strategy allocating
	mismatch string // the members' differing identities, "client=identity" joined by ", "; "" while they agree
}

// agree picks the strategy to allocate with from the allocator identity each member reported
// (allocators, from the lock-table answer; nil when the brokers do not report them). While
// the members that report one disagree, every flowd member picks allocate.Averagely: each
// reads the same answer, so each comes to the same conclusion, and the group never splits
// between two algorithms. stale reports that the brokers have another identity for this
// member than its strategy's now: it must heartbeat before allocating.
func (l *LitePull) agree(me string, cids []string, allocators map[string]string) (s allocate.Strategy, stale bool) {
	s = l.cfg.strategy
	mine := allocate.Identity(s)
	var differ []string
	if allocators != nil {
		if got, ok := allocators[me]; ok && got != mine {
			return s, true
		}
		for _, cid := range cids {
			if id := allocators[cid]; id != "" && id != mine {
				differ = append(differ, cid+"="+id)
			}
		}
	}
	status := allocStatus{inUse: mine}
	if len(differ) > 0 {
		s = allocate.Averagely()
		status = allocStatus{inUse: allocate.Identity(s), mismatch: strings.Join(append(differ, me+"="+mine), ", ")}
	}
	l.mu.Lock()
	old := l.alloc
	l.alloc = status
	l.mu.Unlock()
	switch {
	case status.mismatch != "" && status.mismatch != old.mismatch:
		l.log.Warn("group members run different allocators: allocating with the built-in one until they agree", "allocator", mine, "fallback", status.inUse, "members", status.mismatch)
	case status.mismatch == "" && old.mismatch != "":
		l.log.Info("group members agree on their allocator again", "allocator", mine)
	}
	return s, false
}

// allocMemo is the group assignment last computed for a topic, and the inputs it came from.
type allocMemo struct {
	key    string
	shares map[string][]MessageQueue
}

// groupShares returns every member's share of req's queues, computed by s. Strategies are
// deterministic, so the result is kept per topic and computed again only when an input
// changes: a Wasm allocator then runs once per change of the group, not at every rebalance.
//
// The computation is bounded by the allocate timeout, and runs on a goroutine of its own
// while this one, the rebalance goroutine, keeps renewing the held locks: a slow allocator
// must not let them lapse.
func (l *LitePull) groupShares(ctx context.Context, topic string, s allocate.Strategy, req allocate.Request) (map[string][]MessageQueue, error) {
	key := memoKey(allocate.Identity(s), req)
	if m, ok := l.allocMemo[topic]; ok && m.key == key {
		return m.shares, nil
	}
	actx, cancel := context.WithTimeout(ctx, l.cfg.allocateTimeout)
	defer cancel()
	type result struct {
		shares map[string][]MessageQueue
		err    error
	}
	done := make(chan result, 1)
	go func() {
		shares, err := allocate.Group(actx, s, req)
		done <- result{shares, err}
	}()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				return nil, fmt.Errorf("allocate %q with %s: %w", topic, s.Name(), r.err)
			}
			if l.allocMemo == nil {
				l.allocMemo = map[string]allocMemo{}
			}
			l.allocMemo[topic] = allocMemo{key: key, shares: r.shares}
			return r.shares, nil
		case <-l.renewTick:
			l.renewLocks(ctx)
		case <-actx.Done():
			// A strategy that ignores its context is left to finish on its own; its result
			// goes nowhere.
			return nil, fmt.Errorf("allocate %q with %s: %w", topic, s.Name(), actx.Err())
		}
	}
}

// memoKey encodes a strategy identity and the inputs of an allocation, but the asking member.
func memoKey(identity string, req allocate.Request) string {
	var b strings.Builder
	b.WriteString(identity)
	b.WriteByte(0)
	for _, q := range req.Queues {
		fmt.Fprintf(&b, "%s\x00%s\x00%d\x00", q.Topic, q.BrokerName, q.QueueID)
	}
	b.WriteByte(1)
	for _, id := range req.ClientIDs {
		b.WriteString(id)
		b.WriteByte(0)
	}
	b.WriteByte(1)
	for _, id := range slices.Sorted(maps.Keys(req.Previous)) {
		b.WriteString(id)
		b.WriteByte(0)
		for _, q := range req.Previous[id] {
			fmt.Fprintf(&b, "%s\x00%s\x00%d\x00", q.Topic, q.BrokerName, q.QueueID)
		}
		b.WriteByte(1)
	}
	return b.String()
}

// isFixedPoint reports whether shares, the strategy's assignment given the lock table owners
// as the previous one, gives every member exactly the queues it holds: then no member will
// move anything, whenever it reads the table.
func isFixedPoint(req allocate.Request, shares, owners map[string][]MessageQueue) bool {
	inTopic := make(map[MessageQueue]bool, len(req.Queues))
	for _, mq := range req.Queues {
		inTopic[mq] = true
	}
	held := 0
	for cid, mqs := range owners {
		for _, mq := range mqs {
			if !inTopic[mq] {
				continue // a queue the topic no longer has: nobody reads it
			}
			if _, member := slices.BinarySearch(req.ClientIDs, cid); !member {
				return false // a departed member's lock, until it lapses
			}
			held++
		}
	}
	assigned := 0
	for _, cid := range req.ClientIDs {
		share := shares[cid]
		have := slices.DeleteFunc(slices.Clone(owners[cid]), func(mq MessageQueue) bool { return !inTopic[mq] })
		if !slices.Equal(share, have) {
			return false
		}
		assigned += len(share)
	}
	return assigned == held
}

// lockOwners reads the group's lock table for topic from its brokers (GET_LOCK_OWNERS): for
// each client id, the queues it holds. known is false when a broker does not know the request
// (a RocketMQ broker): no member then gets a previous assignment from it.
// allocators is the allocator identity each member reported, merged over the brokers; nil
// when no broker reported them (an older flowd broker).
func (l *LitePull) lockOwners(ctx context.Context, topic string, addrs []string) (owners map[string][]MessageQueue, allocators map[string]string, known bool, err error) {
	body, err := protocol.MarshalBody(&protocol.LockOwnersRequestBody{ConsumerGroup: l.group, Topic: topic})
	if err != nil {
		return nil, nil, false, fmt.Errorf("lock owners of %q: %w", topic, err)
	}
	owners = map[string][]MessageQueue{}
	for _, addr := range addrs {
		resp, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequest(protocol.GetLockOwners, nil, body))
		if clientcore.IsCode(err, protocol.RequestCodeNotSupported) {
			return nil, nil, false, nil
		}
		if err != nil {
			return nil, nil, false, fmt.Errorf("lock owners of %q on %s: %w", topic, addr, err)
		}
		var out protocol.LockOwnersResponseBody
		if err := protocol.UnmarshalBody(resp.Body, &out); err != nil {
			return nil, nil, false, fmt.Errorf("lock owners of %q from %s: %w", topic, addr, err)
		}
		for cid, mqs := range out.Owners {
			owners[cid] = append(owners[cid], mqs...)
		}
		for cid, id := range out.Allocators {
			if allocators == nil {
				allocators = map[string]string{}
			}
			if id != "" || allocators[cid] == "" {
				allocators[cid] = id
			}
		}
	}
	for _, mqs := range owners {
		slices.SortFunc(mqs, MessageQueue.Compare)
	}
	return owners, allocators, true, nil
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
