package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// ErrNotFound is returned by the administrative methods for an unknown topic, group or
// member.
var ErrNotFound = errors.New("not found")

// ResetOffsets moves a group's committed offsets of topic to the first message stored at or
// after timestamp (Unix milliseconds; 0 means the oldest message kept), and tells the
// group's live members with RESET_CONSUMER_OFFSET so that they continue from there at once.
// It returns the new offset of every queue.
func (b *Broker) ResetOffsets(ctx context.Context, group, topic string, timestamp int64) (map[protocol.MessageQueue]int64, error) {
	if err := ValidateGroup(group); err != nil {
		return nil, fmt.Errorf("reset offsets: %w", err)
	}
	tc, ok := b.topics.get(topic)
	if !ok {
		return nil, fmt.Errorf("reset offsets of %q: topic %q: %w", group, topic, ErrNotFound)
	}
	table := make(map[protocol.MessageQueue]int64, tc.ReadQueueNums)
	for q := range int32(tc.ReadQueueNums) {
		off := b.store.MinOffset(topic, q)
		if timestamp > 0 {
			off = b.store.OffsetByTimestamp(topic, q, timestamp)
		}
		b.commitOffset(group, topic, q, off)
		table[protocol.MessageQueue{Topic: topic, BrokerName: b.cfg.BrokerName, QueueID: int(q)}] = off
	}
	body, err := (&protocol.ResetOffsetBody{OffsetTable: table}).Encode()
	if err != nil {
		return nil, fmt.Errorf("reset offsets of %q: %w", group, err)
	}
	h := &protocol.ResetOffsetRequestHeader{Topic: topic, Group: group, Timestamp: timestamp, IsForce: true}
	var errs []error
	conns := b.consumers.conns(group)
	for _, c := range conns {
		req := protocol.NewRequestWith(protocol.ResetConsumerOffset, h, body)
		if err := c.InvokeOneway(ctx, req); err != nil {
			errs = append(errs, fmt.Errorf("tell %s: %w", c.RemoteAddr(), err))
		}
	}
	b.log.Info("consumer offsets reset", "group", group, "topic", topic, "timestamp", timestamp, "members", len(conns))
	return table, errors.Join(errs...)
}

// ConsumerRunningInfo asks one member of a group for its running state
// (GET_CONSUMER_RUNNING_INFO): its subscriptions and, per queue, what it has cached and
// committed.
func (b *Broker) ConsumerRunningInfo(ctx context.Context, group, clientID string) (*protocol.ConsumerRunningInfo, error) {
	c := b.consumers.conn(group, clientID)
	if c == nil {
		return nil, fmt.Errorf("running info of %q in %q: %w", clientID, group, ErrNotFound)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	h := &protocol.GetConsumerRunningInfoRequestHeader{ConsumerGroup: group, ClientID: clientID}
	resp, err := c.Invoke(ctx, protocol.NewRequestWith(protocol.GetConsumerRunningInfo, h, nil))
	if err != nil {
		return nil, fmt.Errorf("running info of %q: %w", clientID, err)
	}
	if resp.ResponseCode() != protocol.Success {
		return nil, fmt.Errorf("running info of %q: %s: %s", clientID, resp.ResponseCode(), resp.Remark)
	}
	info, err := protocol.DecodeConsumerRunningInfo(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("running info of %q: %w", clientID, err)
	}
	return info, nil
}
