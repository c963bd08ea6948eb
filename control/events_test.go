package control

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/pipeline"
	"github.com/flowd-io/flowd/protocol"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// assertCloudEvent checks the binary-mode CloudEvents headers of an event message.
func assertCloudEvent(t *testing.T, m *nats.Msg, ceType, ceSubject string) {
	t.Helper()
	h := m.Header
	assert.Equal(t, "1.0", h.Get("ce-specversion"), m.Subject)
	assert.NotEmpty(t, h.Get("ce-id"), m.Subject)
	assert.Equal(t, h.Get("ce-id"), h.Get(HeaderMsgID), m.Subject)
	assert.Equal(t, ceType, h.Get("ce-type"), m.Subject)
	assert.Equal(t, "flowd://local/broker-a", h.Get("ce-source"), m.Subject)
	assert.Equal(t, ceSubject, h.Get("ce-subject"), m.Subject)
	assert.Equal(t, "application/json", h.Get("Content-Type"), m.Subject)
	_, err := time.Parse(time.RFC3339, h.Get("ce-time"))
	assert.NoError(t, err, m.Subject)
}

func seqOf(t *testing.T, m *nats.Msg) uint64 {
	t.Helper()
	s, err := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64)
	require.NoError(t, err, "%s has a flowd-seq header", m.Subject)
	return s
}

// Every broker event type appears on its subject, as a CloudEvent, when its cause happens
// over the RocketMQ protocol; names with % and | stay out of the subjects; flowd-seq grows
// across all of them in the order of the causes.
func TestEveryBrokerEventIsPublishedAsACloudEvent(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, func(c *broker.Config) { c.GroupRetention = 300 * time.Millisecond })
	events := subscribeEvents(t, n.ListenURL())
	startPublisher(t, n, b, nil)

	const topic, group, client = "orders%eu|1", "audit%eu|1", "10.0.0.1@42"
	_, started := events.wait(t, "flowd.evt.local.broker.started", nil)
	assert.Equal(t, "dev", started.Version)
	assert.Equal(t, n.ListenURL(), started.NATS)

	rmq := newRocketMQ(t, b)
	rmq.createTopic(topic, 4)
	created, d := events.wait(t, "flowd.evt.local.topic.created", func(d EventData) bool { return d.Topic == topic })
	assertCloudEvent(t, created, "io.flowd.topic.v1.created", topic)
	assert.Equal(t, 4, d.Queues)
	assert.Equal(t, "local", d.Cluster)
	assert.Equal(t, "broker-a", d.Broker)
	assert.Equal(t, seqOf(t, created), d.Seq)

	rmq.heartbeat(group, client, topic)
	groupCreated, _ := events.wait(t, "flowd.evt.local.group.created", func(d EventData) bool { return d.Group == group })
	assertCloudEvent(t, groupCreated, "io.flowd.group.v1.created", group)
	joined, d := events.wait(t, "flowd.evt.local.member.joined", func(d EventData) bool { return d.Group == group })
	assertCloudEvent(t, joined, "io.flowd.member.v1.joined", group)
	assert.Equal(t, client, d.ClientID)

	mq := protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: 1}
	rmq.lock(group, client, mq)
	rebalanced, d := events.wait(t, "flowd.evt.local.group.rebalanced", func(d EventData) bool { return d.Group == group })
	assertCloudEvent(t, rebalanced, "io.flowd.group.v1.rebalanced", group)
	assert.Equal(t, map[string][]protocol.MessageQueue{client: {mq}}, d.Allocation)

	rmq.commit(group, topic, 1, 7)
	rmq.commit(group, topic, 1, 9)
	committed, d := events.wait(t, "flowd.evt.local.offset.committed", func(d EventData) bool {
		return len(d.Offsets) > 0 && d.Offsets[len(d.Offsets)-1].Offset == 9
	})
	assertCloudEvent(t, committed, "io.flowd.offset.v1.committed", group)
	assert.Equal(t, group, d.Group)
	assert.Equal(t, topic, d.Offsets[len(d.Offsets)-1].Topic)
	assert.Equal(t, int32(1), d.Offsets[len(d.Offsets)-1].QueueID)

	require.NoError(t, rmq.cl.Close()) // the member's connection closes
	left, d := events.wait(t, "flowd.evt.local.member.left", func(d EventData) bool { return d.Group == group })
	assertCloudEvent(t, left, "io.flowd.member.v1.left", group)
	assert.Equal(t, client, d.ClientID)
	assert.Equal(t, "connection closed", d.Reason)

	deleted, _ := events.wait(t, "flowd.evt.local.group.deleted", func(d EventData) bool { return d.Group == group })
	assertCloudEvent(t, deleted, "io.flowd.group.v1.deleted", group)

	rmq = newRocketMQ(t, b)
	rmq.deleteTopic(topic)
	topicDeleted, _ := events.wait(t, "flowd.evt.local.topic.deleted", func(d EventData) bool { return d.Topic == topic })
	assertCloudEvent(t, topicDeleted, "io.flowd.topic.v1.deleted", topic)

	causes := []*nats.Msg{created, groupCreated, joined, rebalanced, committed, left, deleted, topicDeleted}
	for i := 1; i < len(causes); i++ {
		assert.Less(t, seqOf(t, causes[i-1]), seqOf(t, causes[i]), "%s before %s", causes[i-1].Subject, causes[i].Subject)
	}
	// Across everything published, sequence numbers only grow, and ids never repeat.
	var last uint64
	ids := map[string]bool{}
	for _, m := range events.all() {
		assert.False(t, ids[m.Header.Get("ce-id")], "ce-id %s repeats", m.Header.Get("ce-id"))
		ids[m.Header.Get("ce-id")] = true
		assert.False(t, strings.ContainsAny(m.Subject, "%|"), m.Subject)
		if m.Header.Get(HeaderSeq) == "" {
			continue
		}
		s := seqOf(t, m)
		assert.Greater(t, s, last, m.Subject)
		last = s
	}
}

// An operator's reset is one offset.reset event naming every queue's new offset.
func TestOffsetResetIsAnEvent(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	events := subscribeEvents(t, n.ListenURL())
	startPublisher(t, n, b, nil)
	rmq := newRocketMQ(t, b)
	rmq.createTopic("resets", 2)
	rmq.commit("resetters", "resets", 0, 0)
	rmq.commit("resetters", "resets", 1, 0)
	_, err := b.ResetOffsetsTo(t.Context(), "resetters", "resets", map[int32]int64{0: 0, 1: 0})
	require.NoError(t, err)
	msg, d := events.wait(t, "flowd.evt.local.offset.reset", nil)
	assertCloudEvent(t, msg, "io.flowd.offset.v1.reset", "resetters")
	assert.Equal(t, []OffsetCommit{
		{Topic: "resets", QueueID: 0, Offset: 0, Seq: d.Seq},
		{Topic: "resets", QueueID: 1, Offset: 0, Seq: d.Seq},
	}, d.Offsets)
}

// Commits of one group within the interval become one event with the latest offset of each
// queue; an event of another kind first publishes the commits coalesced before it.
func TestOffsetCommitsAreCoalescedPerGroup(t *testing.T) {
	n := openEmbedded(t, func(c *NATSConfig) { c.Listen = "off" })
	b := newBroker(t, nil)
	events := &eventLog{}
	sub, err := n.Conn().Subscribe("flowd.evt.>", func(m *nats.Msg) {
		events.mu.Lock()
		events.msgs = append(events.msgs, m)
		events.mu.Unlock()
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	startPublisher(t, n, b, func(c *EventsConfig) { c.OffsetInterval = time.Hour })

	rmq := newRocketMQ(t, b)
	rmq.createTopic("t", 2)
	for i := range int64(5) {
		rmq.commit("g", "t", 0, i+1)
		rmq.commit("g", "t", 1, 10*(i+1))
	}
	rmq.createTopic("u", 1) // publishes the coalesced commits first
	events.wait(t, "flowd.evt.local.topic.created", func(d EventData) bool { return d.Topic == "u" })

	var offsets []*nats.Msg
	for _, m := range events.all() {
		if m.Subject == "flowd.evt.local.offset.committed" {
			offsets = append(offsets, m)
		}
	}
	require.Len(t, offsets, 1, "ten commits of one group within the interval are one event")
	var d EventData
	require.NoError(t, json.Unmarshal(offsets[0].Data, &d))
	require.Len(t, d.Offsets, 2)
	assert.Equal(t, OffsetCommit{Topic: "t", QueueID: 0, Offset: 5, Seq: d.Offsets[0].Seq}, d.Offsets[0])
	assert.Equal(t, OffsetCommit{Topic: "t", QueueID: 1, Offset: 50, Seq: d.Offsets[1].Seq}, d.Offsets[1])
	assert.Equal(t, d.Offsets[1].Seq, d.Seq)
	u, _ := events.wait(t, "flowd.evt.local.topic.created", func(d EventData) bool { return d.Topic == "u" })
	assert.Less(t, seqOf(t, offsets[0]), seqOf(t, u))
}

// With Stream set, events are kept in FLOWD_EVENTS, and a re-published event id is dropped.
func TestEventsStreamKeepsEventsAndDropsRepublishedIDs(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	startPublisher(t, n, b, func(c *EventsConfig) { c.Stream = true; c.StreamMaxAge = time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(n.Conn())
	require.NoError(t, err)
	stream, err := js.Stream(ctx, EventsStreamName)
	require.NoError(t, err)
	assert.Equal(t, []string{"flowd.evt.>"}, stream.CachedInfo().Config.Subjects)
	assert.Equal(t, time.Hour, stream.CachedInfo().Config.MaxAge)

	newRocketMQ(t, b).createTopic("kept", 2)
	var stored *jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		stored, err = stream.GetLastMsgForSubject(ctx, "flowd.evt.local.topic.created")
		return err == nil && strings.Contains(string(stored.Data), `"kept"`)
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, "io.flowd.topic.v1.created", stored.Header.Get("ce-type"))

	info, err := stream.Info(ctx)
	require.NoError(t, err)
	before := info.State.Msgs
	again := nats.NewMsg(stored.Subject)
	again.Header, again.Data = stored.Header, stored.Data
	ack, err := js.PublishMsg(ctx, again)
	require.NoError(t, err)
	assert.True(t, ack.Duplicate, "an event id already stored is a duplicate")
	info, err = stream.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before, info.State.Msgs)
}

// A cluster name that is not a subject token is refused rather than splitting subjects.
func TestPublisherRefusesAClusterNameThatIsNotASubjectToken(t *testing.T) {
	n := openEmbedded(t, func(c *NATSConfig) { c.Listen = "off" })
	b := newBroker(t, nil)
	for _, name := range []string{"eu.west", "a*", ">", "$SYS", "a b", "a\fb"} {
		_, err := NewPublisher(context.Background(), n, b, EventsConfig{Cluster: name, Logger: discardLogger()})
		assert.ErrorIs(t, err, ErrBadConfig, name)
	}
}

// Pipeline events are CloudEvents on flowd.evt.<cluster>.pipeline.<type>, naming the
// pipeline, with the error as reason and no flowd-seq (they are not broker events).
func TestPipelineEventsArePublished(t *testing.T) {
	n := openEmbedded(t, nil)
	b := newBroker(t, nil)
	events := subscribeEvents(t, n.ListenURL())
	p := startPublisher(t, n, b, nil)
	p.Pipeline(pipeline.Event{Type: pipeline.EventPaused, Pipeline: "eu-orders", Time: time.Now()})
	p.Pipeline(pipeline.Event{Type: pipeline.EventFailed, Pipeline: "eu-orders", Err: errors.New("sink closed")})
	msg, d := events.wait(t, "flowd.evt.local.pipeline.paused", nil)
	assertCloudEvent(t, msg, "io.flowd.pipeline.v1.paused", "eu-orders")
	assert.Empty(t, msg.Header.Get(HeaderSeq))
	assert.Equal(t, "eu-orders", d.Pipeline)
	assert.Empty(t, d.Reason)
	msg, d = events.wait(t, "flowd.evt.local.pipeline.failed", nil)
	assertCloudEvent(t, msg, "io.flowd.pipeline.v1.failed", "eu-orders")
	assert.Equal(t, "sink closed", d.Reason)
	assert.False(t, d.Time.IsZero())
}
