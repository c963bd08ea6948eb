package consumer

import (
	"context"
	"fmt"

	"github.com/flowd-io/flowd/protocol"
)

// NewReader returns a consumer that reads the queues it is assigned (Assign) and keeps no
// state anywhere: it joins no group (no heartbeat names it), commits nothing and sends
// nothing back, and its pulls name the reserved group protocol.ReaderGroup, under which a
// flowd broker creates neither a subscription group nor a retry topic. A read that ends, or
// is killed, leaves nothing behind: no group with lag in the listings, no %RETRY% topic, no
// events. It is what a Kafka console consumer without a group is.
//
// Where a queue starts is WithConsumeFrom's alone (there is never a committed offset), and
// Seek moves it. Subscribe fails with ErrSubscribeAndAssign; Commit, CommitOffsets and
// SendBack fail with ErrReadOnly. SetAssignSelector filters, on the broker, what is read.
// Against a broker other than flowd's the reserved group is an ordinary one, created on the
// first pull, as RocketMQ's tools' own groups are.
func NewReader(opts ...Option) (*LitePull, error) {
	return newLitePull(protocol.ReaderGroup, true, opts)
}

// readerStore is the offset store of a reader: nothing is ever stored.
type readerStore struct{}

func (readerStore) read(context.Context, MessageQueue) (int64, error) { return -1, nil }

func (readerStore) persist(_ context.Context, offsets map[MessageQueue]int64) map[MessageQueue]error {
	failed := make(map[MessageQueue]error, len(offsets))
	for mq := range offsets {
		failed[mq] = fmt.Errorf("commit %s: %w", mq, ErrReadOnly)
	}
	return failed
}

// SetAssignSelector sets the selector the broker filters topic's assigned queues with (by
// default every message is read), as RocketMQ's setSubExpressionForAssign does for tags. It
// may be called before or after Assign and Start; queues being read take it from their next
// pull. It fails with ErrSubscribeAndAssign on a consumer with subscriptions, whose selectors
// are Subscribe's.
func (l *LitePull) SetAssignSelector(topic string, sel Selector) error {
	if topic == "" {
		return fmt.Errorf("%w: empty topic", ErrInvalidArgument)
	}
	if sel == nil {
		return fmt.Errorf("%w: nil selector", ErrInvalidArgument)
	}
	if s := l.State(); s != CreateJust && s != Running {
		return fmt.Errorf("assign selector of %q: %w (state %s)", topic, ErrNotRunning, s)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mode == modeSubscribe {
		return fmt.Errorf("assign selector of %q: %w", topic, ErrSubscribeAndAssign)
	}
	sub := newSubscription(topic, sel)
	l.assignSubs[topic] = sub
	for _, q := range l.queues {
		if q.mq.Topic == topic {
			q.sub = sub
		}
	}
	return nil
}
