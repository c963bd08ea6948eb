package protocol

import (
	"cmp"
	"fmt"
)

// MessageQueue names one queue of a topic on one broker. Its JSON form is the one RocketMQ
// clients use in lock bodies and offset tables.
type MessageQueue struct {
	Topic      string `json:"topic"`
	BrokerName string `json:"brokerName"`
	QueueID    int    `json:"queueId"`
}

// String is the Java client's MessageQueue.toString form. Consistent-hash allocation hashes
// this exact string, so it must not change.
func (q MessageQueue) String() string {
	return fmt.Sprintf("MessageQueue [topic=%s, brokerName=%s, queueId=%d]", q.Topic, q.BrokerName, q.QueueID)
}

// Compare orders queues by topic, then broker name, then queue id: the order every member of a
// consumer group sorts by before allocating, so that all members see the same list.
func (q MessageQueue) Compare(o MessageQueue) int {
	if c := cmp.Compare(q.Topic, o.Topic); c != 0 {
		return c
	}
	if c := cmp.Compare(q.BrokerName, o.BrokerName); c != 0 {
		return c
	}
	return cmp.Compare(q.QueueID, o.QueueID)
}
