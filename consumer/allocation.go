package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

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
