package consumer

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// FetchMessageQueues asks the name servers for topic's readable queues, sorted.
func (l *LitePull) FetchMessageQueues(ctx context.Context, topic string) ([]MessageQueue, error) {
	if err := l.checkRunning(); err != nil {
		return nil, err
	}
	r, err := l.cl.UpdateRoute(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("fetch queues of %q: %w", topic, err)
	}
	return slices.Clone(r.SubscribeQueues), nil
}

// RegisterTopicMessageQueueChangeListener calls fn with topic's readable queues every time
// the metadata check (or a route refresh) finds that they changed. The queue set known when
// registering is not reported. fn runs on a consumer or client goroutine and must not block.
func (l *LitePull) RegisterTopicMessageQueueChangeListener(ctx context.Context, topic string, fn func(topic string, queues []MessageQueue)) error {
	if topic == "" || fn == nil {
		return fmt.Errorf("%w: empty topic or nil listener", ErrInvalidArgument)
	}
	l.mu.Lock()
	l.topicListeners[topic] = append(l.topicListeners[topic], fn)
	l.mu.Unlock()
	if l.State() == Running {
		r, err := l.cl.Route(ctx, topic)
		if err != nil {
			return fmt.Errorf("register listener of %q: %w", topic, err)
		}
		l.setTopicQueues(topic, r.SubscribeQueues, false)
	}
	return nil
}

// setTopicQueues records topic's readable queues. With notify, a change triggers a
// rebalance when the topic is subscribed (its first appearance too: a topic created after
// Subscribe), and a change from a known set is passed to the topic listeners.
func (l *LitePull) setTopicQueues(topic string, queues []MessageQueue, notify bool) {
	l.mu.Lock()
	old, known := l.topicQueues[topic]
	if known && slices.Equal(old, queues) {
		l.mu.Unlock()
		return
	}
	l.topicQueues[topic] = slices.Clone(queues)
	listeners := slices.Clone(l.topicListeners[topic])
	_, subscribed := l.subs[topic]
	l.mu.Unlock()
	if !notify {
		return
	}
	if known {
		l.log.Info("topic queues changed", "topic", topic, "queues", len(queues))
		for _, fn := range listeners {
			fn(topic, slices.Clone(queues))
		}
	}
	if subscribed {
		l.triggerRebalance()
	}
}

// triggerRebalance asks the rebalance goroutine to run soon; triggers coalesce.
func (l *LitePull) triggerRebalance() {
	select {
	case l.rebalanceCh <- struct{}{}:
	default:
	}
}

// Missing-route retries: a topic the consumer subscribed to that has no route yet is asked
// for again after missingRouteFirstRetry, doubling up to missingRouteMaxRetry (or the
// metadata-check interval when that is shorter), rather than only at the next metadata check.
const (
	missingRouteFirstRetry = 100 * time.Millisecond
	missingRouteMaxRetry   = 2 * time.Second
)

// metadataLoop runs checkMetadata every metadata-check interval, and on a short backoff while
// a subscribed topic has no route: a topic created after Subscribe (a pipeline started before
// its source topic) is read within missingRouteMaxRetry of its creation, not a whole interval
// later. Subscribe wakes it (metadataCh), so a topic subscribed while running is watched the
// same way.
func (l *LitePull) metadataLoop() {
	defer l.wg.Done()
	retry := missingRouteFirstRetry
	t := time.NewTimer(l.cfg.metadataCheck)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.metadataCh:
			retry = missingRouteFirstRetry
		case <-t.C:
		}
		next := l.cfg.metadataCheck
		if l.checkMetadata() {
			next = min(retry, next)
			retry = min(2*retry, missingRouteMaxRetry)
		} else {
			retry = missingRouteFirstRetry
		}
		t.Stop()
		t.Reset(next)
	}
}

// checkMetadata fetches the routes of the consumer's topics. It reports whether a subscribed
// topic (other than the retry topic, which exists only once something was sent back) has
// no readable queue yet.
func (l *LitePull) checkMetadata() (missing bool) {
	l.mu.Lock()
	subs := make(map[string]bool, len(l.subs))
	for t := range l.subs {
		subs[t] = !isRetryTopic(t)
	}
	l.mu.Unlock()
	for _, topic := range l.topics() {
		r, err := l.cl.UpdateRoute(l.ctx, topic)
		if err != nil {
			l.log.Debug("topic metadata check failed", "topic", topic, "err", err)
			missing = missing || subs[topic]
			continue
		}
		l.setTopicQueues(topic, r.SubscribeQueues, true)
		missing = missing || subs[topic] && len(r.SubscribeQueues) == 0
	}
	return missing
}
