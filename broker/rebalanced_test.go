package broker_test

import (
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// eventLog collects a broker's events of some types.
type eventLog struct {
	mu     sync.Mutex
	events []broker.Event
}

func watchEvents(t *testing.T, b *testBroker, types ...broker.EventType) *eventLog {
	l := &eventLog{}
	cancel := b.Subscribe(func(e broker.Event) {
		for _, typ := range types {
			if e.Type == typ {
				l.mu.Lock()
				l.events = append(l.events, e)
				l.mu.Unlock()
			}
		}
	})
	t.Cleanup(cancel)
	return l
}

func (l *eventLog) all() []broker.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]broker.Event(nil), l.events...)
}

// A rebalance is many lock requests; the group's new assignment is reported once, when the
// locks settle, lease renewals report nothing, and a member leaving reports the rest.
func TestGroupRebalancedReportsTheSettledAssignment(t *testing.T) {
	const group, topic = "rebal", "rebal-topic"
	b := startBroker(t, func(c *broker.Config) { c.RebalanceSettle = 100 * time.Millisecond })
	events := watchEvents(t, b, broker.GroupRebalanced)
	a, other := newRawClient(t, b, nil), newRawClient(t, b, nil)
	require.Equal(t, protocol.Success, a.heartbeat(group, "client-a", topic).ResponseCode())
	require.Equal(t, protocol.Success, other.heartbeat(group, "client-b", topic).ResponseCode())
	mq := func(id int) protocol.MessageQueue {
		return protocol.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueID: id}
	}
	for _, id := range []int{0, 1} { // one request per queue, as a consumer taking over does
		require.Equal(t, protocol.Success, a.lock(protocol.LockBatchMQ, group, "client-a", mq(id)).ResponseCode())
	}
	require.Equal(t, protocol.Success, other.lock(protocol.LockBatchMQ, group, "client-b", mq(2), mq(3)).ResponseCode())

	want := map[string][]protocol.MessageQueue{"client-a": {mq(0), mq(1)}, "client-b": {mq(2), mq(3)}}
	require.Eventually(t, func() bool { return len(events.all()) > 0 }, 5*time.Second, 5*time.Millisecond)
	got := events.all()
	require.Len(t, got, 1, "one settled assignment, not one event per lock request")
	assert.Equal(t, group, got[0].Group)
	assert.Equal(t, want, got[0].Allocation)

	// Renewals change nothing: the next event is the departure, not a renewal.
	require.Equal(t, protocol.Success, a.lock(protocol.LockBatchMQ, group, "client-a", mq(0), mq(1)).ResponseCode())
	other.cl.Close() // client-b's connection closes: it leaves and its locks go
	require.Eventually(t, func() bool { return len(events.all()) == 2 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, map[string][]protocol.MessageQueue{"client-a": {mq(0), mq(1)}}, events.all()[1].Allocation)
	assert.Greater(t, events.all()[1].Seq, got[0].Seq)
}

// A store that stops accepting writes says so on the event bus, with the reason.
func TestStoreFailureIsAnEvent(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(func(name string) bool { return strings.Contains(name, "commitlog") })
	b := startBroker(t, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
	})
	events := watchEvents(t, b, broker.StoreFailed)
	c := newRawClient(t, b, nil)
	c.createTopic("doomed", 1)
	ffs.FailSyncs(syscall.EIO)
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "doomed", BornTimestamp: time.Now().UnixMilli()}
	resp := c.invoke(t.Context(), protocol.SendMessage, h, []byte("x"))
	require.NotEqual(t, protocol.Success, resp.ResponseCode())

	require.Eventually(t, func() bool { return len(events.all()) == 1 }, 5*time.Second, 5*time.Millisecond)
	e := events.all()[0]
	assert.Contains(t, e.Reason, syscall.EIO.Error())
	assert.Equal(t, "broker-a", e.Broker)
}
