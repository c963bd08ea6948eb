package producer

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync/atomic"

	"github.com/flowd-io/flowd/protocol"
)

// MessageQueue is one queue of a topic on one broker.
type MessageQueue = protocol.MessageQueue

// Message is what a producer sends.
type Message struct {
	// Topic is required.
	Topic string
	// Tags is the message's tag (the TAGS property), which consumers filter on.
	Tags string
	// Keys are the message's business keys (the KEYS property, space-separated on the wire).
	Keys []string
	// Properties are user properties, sent along with the well-known ones.
	Properties map[string]string
	// Body is required, and at most the maximum message size.
	Body []byte
	// DelayLevel, when positive, delays delivery by the broker's delay level of that rank
	// (RocketMQ: 1 = 1 s, 2 = 5 s, 3 = 10 s, …). Batches cannot be delayed.
	DelayLevel int
	// ShardingKey is the key HashByKey hashes; when empty it hashes the first of Keys.
	ShardingKey string
	// Flag is opaque to the broker and passed to consumers.
	Flag int32
}

// SendStatus is the outcome of a send the broker accepted. Every status but SendOK says the
// message was stored but not flushed or replicated as the broker is configured to: it will be
// delivered unless the broker's disk (or its only copy) is lost before the flush. Such a send
// returns no error and is not retried, since a retry would store a second copy.
type SendStatus int

const (
	// SendOK: stored (and flushed, with a sync-flush broker).
	SendOK SendStatus = iota
	// SendFlushDiskTimeout: stored, but a sync-flush broker did not flush it in time.
	SendFlushDiskTimeout
	// SendFlushSlaveTimeout: stored, but the replica did not acknowledge it in time.
	SendFlushSlaveTimeout
	// SendSlaveNotAvailable: stored, but no replica is available.
	SendSlaveNotAvailable
)

func (s SendStatus) String() string {
	switch s {
	case SendOK:
		return "SEND_OK"
	case SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	case SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	}
	return fmt.Sprintf("SEND_STATUS_%d", int(s))
}

// SendResult describes a stored message.
type SendResult struct {
	// Status is SendOK, unless the broker stored the message without flushing or replicating
	// it in time.
	Status SendStatus
	// MsgID is the producer-assigned unique id (UNIQ_KEY), which consumers see as the
	// message's MsgID.
	MsgID string
	// OffsetMsgID is the broker's id (store host and commit-log offset).
	OffsetMsgID string
	// Queue is the queue the message went to.
	Queue MessageQueue
	// QueueOffset is the message's offset in Queue.
	QueueOffset int64
	// TransactionID is set for transactional messages only.
	TransactionID string
}

// QueueSelector picks the queue a message goes to.
//
// Select is given the topic's writable queues, sorted and never empty; on a retry they no
// longer include the queue (or the broker) that just failed, unless the selector is an
// OrderedSelector. It must be safe for concurrent use.
type QueueSelector interface {
	Select(msg *Message, queues []MessageQueue) MessageQueue
}

// OrderedSelector is a QueueSelector whose choice may have to stay the same across the
// attempts of one send, because it keeps per-key order: when Ordered reports true, retries go
// to the queue chosen first (on another broker, per-key order would be lost).
type OrderedSelector interface {
	QueueSelector
	// Ordered reports whether retries must stay on the queue chosen first.
	Ordered() bool
}

// RoundRobin sends each message to the next queue in turn: the default.
func RoundRobin() QueueSelector { return &roundRobin{} }

type roundRobin struct{ n atomic.Uint64 }

func (r *roundRobin) Select(_ *Message, queues []MessageQueue) MessageQueue {
	return queues[(r.n.Add(1)-1)%uint64(len(queues))]
}

// Random sends each message to a queue chosen at random.
func Random() QueueSelector { return random{} }

type random struct{}

func (random) Select(_ *Message, queues []MessageQueue) MessageQueue {
	return queues[rand.IntN(len(queues))]
}

// HashByKey sends every message with the same key to the same queue, so that the messages of
// one key are stored, and read, in the order they were sent. The key is the message's
// ShardingKey, or else its first key; messages without either go round robin. A retry stays
// on the same queue.
//
// # Notes
//
// The key→queue mapping depends on the number of queues: it changes when the topic is given
// more queues.
func HashByKey() QueueSelector { return &hashByKey{} }

type hashByKey struct{ rr roundRobin }

func (h *hashByKey) Ordered() bool { return true }

func (h *hashByKey) Select(msg *Message, queues []MessageQueue) MessageQueue {
	key := msg.ShardingKey
	if key == "" && len(msg.Keys) > 0 {
		key = msg.Keys[0]
	}
	if key == "" {
		return h.rr.Select(msg, queues)
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(key))
	return queues[f.Sum32()%uint32(len(queues))]
}
