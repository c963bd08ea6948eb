package broker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// queryOffset asks QUERY_CONSUMER_OFFSET and returns the response code and offset.
func (c *rawClient) queryOffset(group, topic string, queueID int32, setZero *bool) (protocol.ResponseCode, int64) {
	c.t.Helper()
	resp := c.invoke(context.Background(), protocol.QueryConsumerOffset,
		&protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: group, Topic: topic, QueueID: queueID, SetZeroIfNotFound: setZero}, nil)
	if resp.ResponseCode() != protocol.Success {
		return resp.ResponseCode(), -1
	}
	var h protocol.OffsetResponseHeader
	require.NoError(c.t, resp.DecodeHeader(&h))
	return resp.ResponseCode(), h.Offset
}

func (c *rawClient) createTopic(topic string, queues int32) {
	c.t.Helper()
	resp := c.invoke(context.Background(), protocol.UpdateAndCreateTopic,
		&protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite}, nil)
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

func (c *rawClient) sendTo(topic string, queueID int32, body string) *protocol.SendMessageResponseHeader {
	c.t.Helper()
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: topic, QueueID: queueID, BornTimestamp: time.Now().UnixMilli()}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte(body))
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var rh protocol.SendMessageResponseHeader
	require.NoError(c.t, resp.DecodeHeader(&rh))
	return &rh
}

func TestQueryOffsetOfAGroupWithoutOneFollowsRocketMQ(t *testing.T) {
	b := startBroker(t, nil)
	c := newRawClient(t, b, nil)
	c.send("young", "m0", "")
	c.send("young", "m1", "")
	yes, no := true, false

	// Message 0 is in memory: a group without an offset starts at 0, whatever the
	// queue's max offset is.
	code, off := c.queryOffset("g", "young", 0, nil)
	require.Equal(t, protocol.Success, code)
	require.Equal(t, int64(0), off)
	code, off = c.queryOffset("g", "young", 0, &yes)
	require.Equal(t, protocol.Success, code)
	require.Equal(t, int64(0), off)
	// A queue that was never written, and a topic that does not exist yet, start at 0 too.
	code, off = c.queryOffset("g", "young", 3, nil)
	require.Equal(t, protocol.Success, code)
	require.Equal(t, int64(0), off)
	code, off = c.queryOffset("g", "not-yet", 0, nil)
	require.Equal(t, protocol.Success, code)
	require.Equal(t, int64(0), off)
	// setZeroIfNotFound=false asks for the truth: there is no offset.
	code, _ = c.queryOffset("g", "young", 0, &no)
	require.Equal(t, protocol.QueryNotFound, code)
	// A stored offset always wins.
	resp := c.invoke(context.Background(), protocol.UpdateConsumerOffset,
		&protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "g", Topic: "young", QueueID: 0, CommitOffset: 2}, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	code, off = c.queryOffset("g", "young", 0, &no)
	require.Equal(t, protocol.Success, code)
	require.Equal(t, int64(2), off)
}

func TestQueryOffsetOfAGroupWithoutOneIsNotFoundWhenMessageZeroIsOnDisk(t *testing.T) {
	// A one-byte memory budget puts every message but the log's end "on disk".
	b := startBroker(t, func(cfg *broker.Config) { cfg.Store.MemoryBudget = 1 })
	c := newRawClient(t, b, nil)
	c.send("old", "m0", "")
	require.Eventually(t, func() bool { return b.StoreMax("old", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	code, _ := c.queryOffset("g", "old", 0, nil)
	require.Equal(t, protocol.QueryNotFound, code, "message 0 is on disk: the client decides")
	code, off := c.queryOffset("g", "old", 1, nil)
	require.Equal(t, protocol.Success, code, "an empty queue has nothing on disk")
	require.Equal(t, int64(0), off)
}

// A pull whose offset falls in a consume-queue file that is gone (retention removed it
// before the queue's min offset moved) is told where the next file starts at once: parking
// it would only delay the consumer by the whole suspend time.
func TestPullLandingOnAMissingConsumeQueueFileAnswersAtOnce(t *testing.T) {
	mod := func(cfg *broker.Config) {
		cfg.Store.ConsumeQueueUnits = 10
		cfg.MaxLongPoll = time.Hour
	}
	b := startBroker(t, mod)
	dir := b.cfg.DataDir
	c := newRawClient(t, b, nil)
	c.createTopic("holes", 1)
	for i := range 25 {
		c.sendTo("holes", 0, fmt.Sprintf("m%d", i))
	}
	require.Eventually(t, func() bool { return b.StoreMax("holes", 0) == 25 }, 5*time.Second, 5*time.Millisecond)
	b.stop(t)
	// Units 10..19 live in the second file, named by its byte offset (10 units × 20 bytes).
	require.NoError(t, os.Remove(filepath.Join(dir, "store", "consumequeue", "holes", "0", "00000000000000000200")))

	b2 := startBroker(t, func(cfg *broker.Config) { mod(cfg); cfg.DataDir = dir })
	c2 := newRawClient(t, b2, nil)
	// The pull asks to be suspended for an hour; it must not wait for anything.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp := c2.invoke(ctx, protocol.PullMessage, pullHeader("holes", 12, time.Hour, "*"), nil)
	require.Equal(t, protocol.PullNotFound, resp.ResponseCode(), resp.Remark)
	require.Equal(t, "OFFSET_FOUND_NULL", resp.Remark)
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	require.Equal(t, int64(20), rh.NextBeginOffset, "the next file's first unit")

	resp = c2.invoke(ctx, protocol.PullMessage, pullHeader("holes", rh.NextBeginOffset, time.Hour, "*"), nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}
