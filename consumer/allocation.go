package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/internal/client"
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
		case isRetryTopic(topic) && errors.Is(err, client.ErrTopicNotExist):
			l.log.Debug("rebalance: no retry topic yet (nothing was sent back)", "topic", topic)
		default:
			l.log.Warn("rebalance: no route", "topic", topic, "err", err)
		}
		// A topic that does not exist is settled as it is; a failed request is tried again.
		return nil, false, errors.Is(err, client.ErrTopicNotExist), false
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
	known := false
	if l.cfg.handoverLocks { // allocate runs for subscriptions only: locked mode
		if prev, known, err = l.lockOwners(ctx, topic, r.BrokerAddrs()); err != nil {
			if ctx.Err() == nil {
				l.log.Warn("rebalance: no lock table", "topic", topic, "err", err)
			}
			return nil, false, false, false
		}
	}
	req := allocate.Request{Group: l.group, ClientID: me, Queues: queues, ClientIDs: cids, Previous: prev}
	mine, err = l.cfg.strategy.Allocate(ctx, req)
	if err != nil {
		l.log.Error("rebalance: allocation failed", "topic", topic, "strategy", l.cfg.strategy.Name(), "err", err)
		return nil, false, true, false
	}
	slices.SortFunc(mine, MessageQueue.Compare)
	mine = slices.Compact(mine)
	settled = !known || l.isFixedPoint(ctx, req, prev)
	return mine, known, settled, true
}

// isFixedPoint reports whether the strategy, given the lock table owners as the previous
// assignment, gives every member exactly the queues it holds: then no member will move
// anything, whenever it reads the table.
func (l *LitePull) isFixedPoint(ctx context.Context, req allocate.Request, owners map[string][]MessageQueue) bool {
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
		req.ClientID = cid
		share, err := l.cfg.strategy.Allocate(ctx, req)
		if err != nil {
			return false
		}
		slices.SortFunc(share, MessageQueue.Compare)
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
func (l *LitePull) lockOwners(ctx context.Context, topic string, addrs []string) (owners map[string][]MessageQueue, known bool, err error) {
	body, err := protocol.MarshalBody(&protocol.LockOwnersRequestBody{ConsumerGroup: l.group, Topic: topic})
	if err != nil {
		return nil, false, fmt.Errorf("lock owners of %q: %w", topic, err)
	}
	owners = map[string][]MessageQueue{}
	for _, addr := range addrs {
		resp, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequest(protocol.GetLockOwners, nil, body))
		if client.IsCode(err, protocol.RequestCodeNotSupported) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("lock owners of %q on %s: %w", topic, addr, err)
		}
		var out protocol.LockOwnersResponseBody
		if err := protocol.UnmarshalBody(resp.Body, &out); err != nil {
			return nil, false, fmt.Errorf("lock owners of %q from %s: %w", topic, addr, err)
		}
		for cid, mqs := range out.Owners {
			owners[cid] = append(owners[cid], mqs...)
		}
	}
	for _, mqs := range owners {
		slices.SortFunc(mqs, MessageQueue.Compare)
	}
	return owners, true, nil
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
