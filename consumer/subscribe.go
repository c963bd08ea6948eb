package consumer

import (
	"fmt"
	"maps"
	"slices"
)

// Subscribe subscribes to topic with a tag expression: "*" or "" for every message, or tags
// separated by "||". Subscribing again to a topic replaces its expression. It may be called
// before or after Start; once running, the group rebalances at once. In clustering the first
// subscription also subscribes the group's retry topic %RETRY%<group> (see SendBack).
func (l *LitePull) Subscribe(topic, expr string) error {
	return l.SubscribeSelector(topic, TagSelector(expr))
}

// SubscribeSelector subscribes to topic with a selector.
func (l *LitePull) SubscribeSelector(topic string, sel Selector) error {
	if topic == "" {
		return fmt.Errorf("%w: empty topic", ErrInvalidArgument)
	}
	if sel == nil {
		return fmt.Errorf("%w: nil selector", ErrInvalidArgument)
	}
	if s := l.State(); s != CreateJust && s != Running {
		return fmt.Errorf("subscribe %q: %w (state %s)", topic, ErrNotRunning, s)
	}
	if l.cfg.reader {
		return fmt.Errorf("subscribe %q: %w: a reader reads assigned queues only", topic, ErrSubscribeAndAssign)
	}
	l.mu.Lock()
	if l.mode == modeAssign {
		l.mu.Unlock()
		return fmt.Errorf("subscribe %q: %w", topic, ErrSubscribeAndAssign)
	}
	l.mode = modeSubscribe
	sub := newSubscription(topic, sel)
	l.subs[topic] = sub
	if retry := l.retryTopic(); l.cfg.model == Clustering && l.subs[retry] == nil {
		// Messages sent back (SendBack) come back through the group's retry topic, which every
		// member reads, as RocketMQ's clustering consumers do.
		l.subs[retry] = newSubscription(retry, TagSelector("*"))
	}
	for _, q := range l.queues {
		if q.mq.Topic == topic {
			q.sub = sub
		}
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
	select { // a topic without a route yet is then asked for on the short backoff
	case l.metadataCh <- struct{}{}:
	default:
	}
	return nil
}

// Unsubscribe drops the subscription to topic; its queues are committed and released at the
// next rebalance, which runs at once.
func (l *LitePull) Unsubscribe(topic string) error {
	l.mu.Lock()
	delete(l.subs, topic)
	if retry := l.retryTopic(); len(l.subs) == 1 && l.subs[retry] != nil {
		delete(l.subs, retry) // read only along with a subscription
	}
	if len(l.subs) == 0 && l.mode == modeSubscribe {
		l.mode = modeNone
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
	return nil
}

// Assign makes the consumer read exactly queues, without sharing them with the group: no
// rebalance, no hand-over locks. Assigning again replaces the set; an empty set releases every
// queue. Assign fails with ErrSubscribeAndAssign on a consumer with subscriptions.
func (l *LitePull) Assign(queues []MessageQueue) error {
	if s := l.State(); s != CreateJust && s != Running {
		return fmt.Errorf("assign: %w (state %s)", ErrNotRunning, s)
	}
	for _, mq := range queues {
		if mq.Topic == "" || mq.BrokerName == "" || mq.QueueID < 0 {
			return fmt.Errorf("%w: assign: bad queue %v", ErrInvalidArgument, mq)
		}
	}
	l.mu.Lock()
	if l.mode == modeSubscribe {
		l.mu.Unlock()
		return fmt.Errorf("assign: %w", ErrSubscribeAndAssign)
	}
	l.assigned = map[MessageQueue]bool{}
	for _, mq := range queues {
		l.assigned[mq] = true
	}
	l.mode = modeAssign
	if len(queues) == 0 {
		l.mode = modeNone
	}
	l.mu.Unlock()
	l.triggerRebalance()
	return nil
}

// Assignment returns the queues assigned to this consumer, sorted: by the last rebalance, or
// by Assign. With hand-over locks, a queue just assigned may still be waiting for its
// previous owner to release it. Queues of the group's retry topic, which the consumer reads
// on its own (see SendBack), are left out.
func (l *LitePull) Assignment() []MessageQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Collect(maps.Keys(l.queues))
	if l.mode == modeSubscribe {
		out = slices.DeleteFunc(out, func(mq MessageQueue) bool { return mq.Topic == l.retryTopic() })
	}
	slices.SortFunc(out, MessageQueue.Compare)
	return out
}
