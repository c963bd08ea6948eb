package broker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// QueueRead is what ReadQueue read of one queue.
type QueueRead struct {
	// Messages are decoded copies, in queue order; bodies as stored (compressed or not).
	Messages []*protocol.MessageExt
	// Next is where the next read of the queue should start.
	Next int64
	// Min and Max are the queue's bounds at the time of the read (Max exclusive).
	Min, Max int64
}

// readQueueMaxBytes bounds the bytes one ReadQueue holds (the first message is read
// whatever its size): an inspection must not hold a pull's worth of large bodies.
const readQueueMaxBytes = 8 << 20

// ReadQueue reads up to maxMsgs messages of one queue from offset, for inspection (the
// console's browse and search): no group, no offset commit, no long poll. An offset below
// the queue's first stored one starts at that one. An unknown topic or a queue past its
// read queues fails with ErrNotFound. Fewer than maxMsgs come back past 8 MiB of messages.
func (b *Broker) ReadQueue(ctx context.Context, topic string, queueID int32, offset int64, maxMsgs int) (QueueRead, error) {
	if err := b.knownQueue(topic, queueID); err != nil {
		return QueueRead{}, fmt.Errorf("read %s/%d: %w", topic, queueID, err)
	}
	if maxMsgs <= 0 {
		maxMsgs = 1
	}
	res, err := b.store.GetMessage(ctx, topic, queueID, offset, maxMsgs, readQueueMaxBytes, nil)
	if err != nil {
		return QueueRead{}, fmt.Errorf("read %s/%d at %d: %w", topic, queueID, offset, err)
	}
	defer res.Release()
	out := QueueRead{Next: res.NextBeginOffset, Min: res.MinOffset, Max: res.MaxOffset}
	for _, raw := range res.Messages {
		// Messages alias the store's read buffer, released on return: decode a copy.
		m, _, err := protocol.DecodeStored(append([]byte(nil), raw...))
		if err != nil {
			return QueueRead{}, fmt.Errorf("read %s/%d at %d: decode: %w", topic, queueID, offset, err)
		}
		out.Messages = append(out.Messages, m)
	}
	return out, nil
}

// OffsetByTime is the queue offset of the first message stored at or after ts (Unix
// milliseconds), the answer of SEARCH_OFFSET_BY_TIMESTAMP; ErrNotFound for an unknown
// topic or queue.
func (b *Broker) OffsetByTime(topic string, queueID int32, ts int64) (int64, error) {
	if err := b.knownQueue(topic, queueID); err != nil {
		return 0, fmt.Errorf("offset by time of %s/%d: %w", topic, queueID, err)
	}
	return b.store.OffsetByTimestamp(topic, queueID, ts), nil
}

// knownQueue fails with ErrNotFound unless topic exists and queueID is one of its read
// queues.
func (b *Broker) knownQueue(topic string, queueID int32) error {
	tc, ok := b.topics.get(topic)
	if !ok {
		return fmt.Errorf("topic %q: %w", topic, ErrNotFound)
	}
	if queueID < 0 || int(queueID) >= tc.ReadQueueNums {
		return fmt.Errorf("queue %d of topic %q (%d read queues): %w", queueID, topic, tc.ReadQueueNums, ErrNotFound)
	}
	return nil
}

// ErrBadMessage is returned by Send for a message the broker would refuse from a producer:
// an empty body or one over the size limit.
var ErrBadMessage = errors.New("bad message")

// SendResult is where Send stored a message.
type SendResult struct {
	// MsgID is the offset message id (MessageByID finds the message again); UniqKey the
	// UNIQ_KEY property Send gave it, as a producer does.
	MsgID, UniqKey string
	QueueID        int32
	QueueOffset    int64
	StoreTime      time.Time
}

// Send stores one message in an existing topic through Produce, as a send from a producer
// on this node would: a random write queue when queueID is negative, the UNIQ_KEY a
// producer sets and the broker's CLUSTER property. It is the control plane's way to put a
// test message without a client; delayed and transactional messages are not supported
// (their properties are refused). It fails as Produce does: ErrNotFound for an unknown
// topic, ErrReserved for one of the broker's own, ErrBadMessage for a bad body, and in a
// replica set as the set says.
func (b *Broker) Send(ctx context.Context, m protocol.Message, queueID int32) (SendResult, error) {
	props := maps.Clone(m.Properties)
	if props == nil {
		props = map[string]string{}
	}
	for _, k := range []string{protocol.PropertyDelayLevel, protocol.PropertyTransactionPrepared} {
		if _, ok := props[k]; ok {
			return SendResult{}, fmt.Errorf("send to %q: property %s is not supported here: %w", m.Topic, k, ErrBadMessage)
		}
	}
	if props[protocol.PropertyUniqueKey] == "" {
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return SendResult{}, fmt.Errorf("send to %q: unique key: %w", m.Topic, err)
		}
		props[protocol.PropertyUniqueKey] = strings.ToUpper(hex.EncodeToString(id[:]))
	}
	m.Properties = props
	res, err := b.Produce(ctx, ProduceRequest{Message: m, QueueID: queueID})
	return res.SendResult, err
}
