package consumer_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

func newReader(t *testing.T, b *broker.Broker, opts ...consumer.Option) *consumer.LitePull {
	t.Helper()
	r, err := consumer.NewReader(append(fastOpts(b), opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.Close(ctx)
	})
	return r
}

// brokerState is what a broker keeps about groups: their names, the topics' names, and
// whether any group subscribes to or has offsets on topic.
func brokerState(b *broker.Broker, topic string) (groups, topics []string, offsets bool) {
	for _, g := range b.Groups() {
		groups = append(groups, g.Name)
		offsets = offsets || slices.Contains(g.Topics, topic)
	}
	for _, tc := range b.Topics() {
		topics = append(topics, tc.Name)
	}
	return groups, topics, offsets
}

// A reader reads assigned queues, with a filter, and leaves nothing on the broker: no
// subscription group, no retry topic, no offsets, no member; its commits are refused.
func TestReaderLeavesNothingOnTheBroker(t *testing.T) {
	b := startBroker(t, nil)
	mqs := createTopic(t, b, "readme", 2)
	p := newProducer(t, b)
	produce(t, p, "readme", "m", 10, func(i int, m *producer.Message) {
		m.Properties = map[string]string{"n": strconv.Itoa(i)}
	})
	groupsBefore, topicsBefore, _ := brokerState(b, "readme")

	r := newReader(t, b, consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	assert.Equal(t, protocol.ReaderGroup, r.Group())
	require.NoError(t, r.SetAssignSelector("readme", consumer.SQLSelector("n >= 6")))
	require.NoError(t, r.Assign(mqs))
	require.NoError(t, r.Start(context.Background()))
	got := pollN(t, r, 4, wait)
	assert.Equal(t, []string{"m-6", "m-7", "m-8", "m-9"}, sortedBodies(got), "the selector applies to assigned queues")

	require.ErrorIs(t, r.Commit(context.Background()), consumer.ErrReadOnly)
	require.ErrorIs(t, r.CommitOffsets(context.Background(), map[consumer.MessageQueue]int64{mqs[0]: 1}), consumer.ErrReadOnly)
	require.ErrorIs(t, r.Subscribe("readme", "*"), consumer.ErrSubscribeAndAssign)
	require.NoError(t, r.Close(context.Background()))

	groups, topics, offsets := brokerState(b, "readme")
	assert.Equal(t, groupsBefore, groups, "no group created")
	assert.Equal(t, topicsBefore, topics, "no retry topic created")
	assert.False(t, offsets, "no offsets stored")
	for _, name := range topics {
		assert.False(t, strings.HasPrefix(name, broker.RetryTopicPrefix), name)
	}
	assert.Equal(t, int64(-1), brokerOffset(t, b, protocol.ReaderGroup, mqs[0]))
}

// The broker keeps the reader group stateless whoever names it: a heartbeat, a commit or a
// send-back under it is refused, and a pull under it creates nothing even where groups must
// be created beforehand.
func TestBrokerRefusesStateForTheReaderGroup(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) { c.DisableAutoCreateGroups = true })
	mqs := createTopic(t, b, "guarded", 1)
	p := newProducer(t, b)
	produce(t, p, "guarded", "g", 3, nil)

	r := newReader(t, b, consumer.WithConsumeFrom(consumer.ConsumeFromFirst))
	require.NoError(t, r.Assign(mqs))
	require.NoError(t, r.Start(context.Background()))
	assert.Len(t, pollN(t, r, 3, wait), 3, "a reader pulls where an unknown group could not")

	_, err := consumer.NewLitePull(protocol.ReaderGroup, fastOpts(b)...)
	require.ErrorIs(t, err, consumer.ErrInvalidArgument, "a member of the reader group is refused at once")

	// Another client naming the group in a heartbeat, a commit or a send-back is refused.
	cl := admin(t, b)
	hb, err := (&protocol.HeartbeatData{ClientID: "intruder", ConsumerDataSet: []protocol.ConsumerData{{
		GroupName: protocol.ReaderGroup, ConsumeType: protocol.ConsumeActively, MessageModel: "CLUSTERING",
		SubscriptionDataSet: []protocol.SubscriptionData{{Topic: "guarded", SubString: "*"}},
	}}}).Encode()
	require.NoError(t, err)
	for _, req := range []*protocol.Command{
		protocol.NewRequest(protocol.HeartBeat, nil, hb),
		protocol.NewRequestWith(protocol.UpdateConsumerOffset, &protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: protocol.ReaderGroup, Topic: "guarded", QueueID: 0, CommitOffset: 1}, nil),
		protocol.NewRequestWith(protocol.ConsumerSendMsgBack, &protocol.ConsumerSendMsgBackRequestHeader{Group: protocol.ReaderGroup, Offset: 0, OriginTopic: "guarded"}, nil),
	} {
		resp, err := cl.Invoke(context.Background(), b.Addr(), req)
		require.NoError(t, err)
		assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode(), "%s", req.RequestCode())
		assert.Contains(t, resp.Remark, "keeps no state", "%s", req.RequestCode())
	}
	assert.Empty(t, b.Groups())
	_, ok := b.Topic(broker.RetryTopicPrefix + protocol.ReaderGroup)
	assert.False(t, ok)
}
