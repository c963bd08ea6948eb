package broker

import (
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
)

// The methods in this file let an operator (and the NATS control plane to come) look at the
// broker's state. They return copies.

// Topic returns a topic's configuration.
func (b *Broker) Topic(name string) (TopicConfig, bool) { return b.topics.get(name) }

// Topics returns every topic, sorted by name.
func (b *Broker) Topics() []TopicConfig { return b.topics.list() }

// GroupMembers returns the client ids of a consumer group's live members, sorted.
func (b *Broker) GroupMembers(group string) []string { return b.consumers.clientIDs(group) }

// CommittedOffset returns a group's committed offset of a queue.
func (b *Broker) CommittedOffset(group, topic string, queueID int32) (int64, bool) {
	return b.offsets.query(group, topic, queueID)
}

// LockedQueues returns the queues of a group locked by orderly or hand-over consumers, with
// the client id holding each.
func (b *Broker) LockedQueues(group string) map[protocol.MessageQueue]string {
	return b.locks.held(group, time.Now())
}

// WaitingPulls returns the number of long-polling pulls that found nothing and wait for a
// message or their suspend time.
func (b *Broker) WaitingPulls() int64 { return b.poll.waiting.Load() }

// StoreStats returns the store's positions and counters.
func (b *Broker) StoreStats() store.Stats { return b.store.Stats() }

// StoreMax returns a queue's max offset (exclusive).
func (b *Broker) StoreMax(topic string, queueID int32) int64 {
	return b.store.MaxOffset(topic, queueID)
}

// Connections returns the number of open client connections to the broker listener (the
// name service's are not counted); 0 before Start.
func (b *Broker) Connections() int {
	if b.server == nil {
		return 0
	}
	return b.server.ConnCount()
}
