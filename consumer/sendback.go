package consumer

import (
	"context"
	"fmt"
	"strings"

	"github.com/flowd-io/flowd/protocol"
)

// SendBack hands m, which the application could not process, back to the broker for a later
// retry (CONSUMER_SEND_MSG_BACK): the broker stores a copy in the group's retry topic
// %RETRY%<group> to be delivered again after the delay of delayLevel (1 is the shortest, 0
// lets the broker choose from the number of earlier attempts, as RocketMQ does; a negative
// level sends m to the dead-letter topic at once). After the maximum number of attempts
// (WithMaxReconsumeTimes, by default the broker's) the copy goes to the dead-letter topic
// %DLQ%<group> instead, which nobody reads unless told to.
//
// In clustering the consumer reads the retry topic along with its subscriptions, so the copy
// comes back through Poll, with Topic the original topic, Queue the retry queue it was read
// from and ReconsumeTimes counting the attempts. m itself counts as consumed: committing past
// it is right. It is rocketmq-client-go's ConsumeRetryLater for a pull consumer.
func (l *LitePull) SendBack(ctx context.Context, m *Message, delayLevel int) error {
	if err := l.checkRunning(); err != nil {
		return err
	}
	if m == nil {
		return fmt.Errorf("%w: send back a nil message", ErrInvalidArgument)
	}
	if l.cfg.reader {
		return fmt.Errorf("send back %s: %w", m.MsgID, ErrReadOnly)
	}
	if l.cfg.model == Broadcasting {
		return fmt.Errorf("send back %s: %w: broadcasting consumers have no retry topic", m.MsgID, ErrInvalidArgument)
	}
	if delayLevel < 0 {
		delayLevel = -1
	}
	addr, err := l.cl.FindBrokerAddr(ctx, m.Queue.BrokerName, m.Queue.Topic)
	if err != nil {
		return fmt.Errorf("send back %s: %w", m.MsgID, err)
	}
	h := protocol.ConsumerSendMsgBackRequestHeader{
		Offset:            m.CommitLogOffset,
		Group:             l.group,
		DelayLevel:        int32(delayLevel),
		OriginMsgID:       m.MsgID,
		OriginTopic:       m.Topic,
		MaxReconsumeTimes: l.cfg.maxReconsume,
		BrokerName:        m.Queue.BrokerName,
	}
	if _, err := l.cl.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.ConsumerSendMsgBack, &h, nil)); err != nil {
		return fmt.Errorf("send back %s to %s: %w", m.MsgID, addr, err)
	}
	retry := l.retryTopic()
	l.mu.Lock()
	_, subscribed := l.subs[retry]
	known := len(l.topicQueues[retry]) > 0
	l.mu.Unlock()
	if subscribed && !known {
		// The broker creates the retry topic on the first send-back: read it now rather than
		// at the next metadata check.
		l.triggerRebalance()
	}
	return nil
}

// retryTopic is the group's retry topic.
func (l *LitePull) retryTopic() string { return retryTopicPrefix + l.group }

// isRetryTopic reports whether topic is a retry topic.
func isRetryTopic(topic string) bool { return strings.HasPrefix(topic, retryTopicPrefix) }
