package broker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// txnClient is a raw producer of a transactional group: it sends half messages, ends
// transactions, and records the check-backs the broker sends it.
type txnClient struct {
	*rawClient
	group string

	mu     sync.Mutex
	checks []*protocol.Command
	// answer, when set, is called for every check-back on the connection's goroutine.
	answer func(h *protocol.CheckTransactionStateRequestHeader, m *protocol.MessageExt)
}

func newTxnClient(t *testing.T, b *testBroker, group string) *txnClient {
	tc := &txnClient{group: group}
	tc.rawClient = newRawClient(t, b, remoting.HandlerFunc(func(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		if req.RequestCode() != protocol.CheckTransactionState {
			return nil
		}
		tc.mu.Lock()
		tc.checks = append(tc.checks, req)
		answer := tc.answer
		tc.mu.Unlock()
		if answer != nil {
			var h protocol.CheckTransactionStateRequestHeader
			if assert.NoError(t, req.DecodeHeader(&h)) {
				m, _, err := protocol.DecodeStored(req.Body)
				if assert.NoError(t, err) {
					answer(&h, m)
				}
			}
		}
		return nil
	}))
	hb := protocol.HeartbeatData{ClientID: "127.0.0.1@" + group, ProducerDataSet: []protocol.ProducerData{{GroupName: group}}}
	body, err := hb.Encode()
	require.NoError(t, err)
	resp := tc.invoke(context.Background(), protocol.HeartBeat, nil, body)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	return tc
}

func (c *txnClient) setAnswer(fn func(*protocol.CheckTransactionStateRequestHeader, *protocol.MessageExt)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answer = fn
}

// checkOffsets returns the half offsets of the check-backs received so far.
func (c *txnClient) checkOffsets() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int64, 0, len(c.checks))
	for _, req := range c.checks {
		var h protocol.CheckTransactionStateRequestHeader
		require.NoError(c.t, req.DecodeHeader(&h))
		out = append(out, h.TranStateTableOffset)
	}
	return out
}

// sendHalf sends a half message to queue 0 of topic, as rocketmq-client-go does.
func (c *txnClient) sendHalf(topic, body string) *protocol.SendMessageResponseHeader {
	c.t.Helper()
	props := map[string]string{
		protocol.PropertyTransactionPrepared: "true", protocol.PropertyProducerGroup: c.group,
		protocol.PropertyTags: "tx", protocol.PropertyKeys: "k-" + body, protocol.PropertyUniqueKey: "U-" + body, "user": "v",
	}
	h := &protocol.SendMessageRequestHeader{
		ProducerGroup: c.group, Topic: topic, DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 1,
		SysFlag: protocol.MsgTransactionPrepared, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props),
	}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte(body))
	require.Equal(c.t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var rh protocol.SendMessageResponseHeader
	require.NoError(c.t, resp.DecodeHeader(&rh))
	return &rh
}

// end sends END_TRANSACTION for the half message a send answered with rh, and waits for
// the answer.
func (c *txnClient) end(rh *protocol.SendMessageResponseHeader, how int32) *protocol.Command {
	c.t.Helper()
	return c.invoke(context.Background(), protocol.EndTransaction, c.endHeader(rh.QueueOffset, rh.MsgID, how, false), nil)
}

func (c *txnClient) endHeader(halfOffset int64, offsetMsgID string, how int32, fromCheck bool) *protocol.EndTransactionRequestHeader {
	c.t.Helper()
	_, clOffset, err := protocol.ParseOffsetMsgID(offsetMsgID)
	require.NoError(c.t, err)
	return &protocol.EndTransactionRequestHeader{
		ProducerGroup: c.group, TranStateTableOffset: halfOffset, CommitLogOffset: clOffset,
		CommitOrRollback: how, FromTransactionCheck: fromCheck,
	}
}

// endOneway sends END_TRANSACTION oneway, as clients do.
func (c *txnClient) endOneway(h *protocol.EndTransactionRequestHeader) {
	c.t.Helper()
	require.NoError(c.t, c.cl.InvokeOneway(context.Background(), c.b.Addr(), protocol.NewRequestWith(protocol.EndTransaction, h, nil)))
}

// pullAll pulls queue 0 of topic from offset 0.
func (c *txnClient) pullAll(topic string) []*protocol.MessageExt {
	c.t.Helper()
	resp := c.invoke(context.Background(), protocol.PullMessage, pullHeader(topic, 0, 0, "*"), nil)
	if resp.ResponseCode() != protocol.Success {
		return nil
	}
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(c.t, err)
	return msgs
}

func txnConfig(timeout, interval time.Duration, maxChecks int) func(*broker.Config) {
	return func(cfg *broker.Config) {
		cfg.TransactionTimeout, cfg.TransactionCheckInterval, cfg.TransactionCheckMax = timeout, interval, maxChecks
	}
}

// A committed half message is stored once in its real topic, with its properties and
// without the transaction markers; until then no pull sees it.
func TestTransactionCommitDeliversOnceWithTheOriginalProperties(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	rh := c.sendHalf("tx", "half-1")
	assert.Equal(t, int32(0), rh.QueueID, "the answer names the real queue")
	assert.Equal(t, 1, b.PendingTransactions())

	// Invisible: not in the real topic, and the half topic cannot be pulled or sent to.
	require.Eventually(t, func() bool { return b.StoreMax(protocol.TransactionHalfTopic, 0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, b.StoreMax("tx", 0))
	assert.Empty(t, c.pullAll("tx"))
	resp := c.invoke(context.Background(), protocol.PullMessage, pullHeader(protocol.TransactionHalfTopic, 0, 0, "*"), nil)
	assert.Equal(t, protocol.TopicNotExist, resp.ResponseCode(), resp.Remark)
	sh := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: protocol.TransactionHalfTopic, BornTimestamp: 1}
	resp = c.invoke(context.Background(), protocol.SendMessage, sh, []byte("forged"))
	assert.Equal(t, protocol.NoPermission, resp.ResponseCode(), resp.Remark)

	c.endOneway(c.endHeader(rh.QueueOffset, rh.MsgID, protocol.MsgTransactionCommit, false))
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	msgs := c.pullAll("tx")
	require.Len(t, msgs, 1)
	m := msgs[0]
	assert.Equal(t, "half-1", string(m.Body))
	assert.Equal(t, "tx", m.Topic)
	assert.Equal(t, int32(protocol.MsgTransactionCommit), m.SysFlag&protocol.MsgTransactionMask)
	assert.Equal(t, "tx", m.Properties[protocol.PropertyTags])
	assert.Equal(t, "k-half-1", m.Properties[protocol.PropertyKeys])
	assert.Equal(t, "U-half-1", m.Properties[protocol.PropertyUniqueKey])
	assert.Equal(t, "v", m.Properties["user"])
	assert.Equal(t, "tx-producers", m.Properties[protocol.PropertyProducerGroup])
	for _, k := range []string{protocol.PropertyTransactionPrepared, protocol.PropertyRealTopic, protocol.PropertyRealQueueID} {
		assert.NotContains(t, m.Properties, k)
	}
	// The op record marks the half message done.
	require.Eventually(t, func() bool { return b.StoreMax(protocol.TransactionOpTopic, 0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Zero(t, b.PendingTransactions())

	// A second END_TRANSACTION, either way, is refused and stores nothing.
	for _, how := range []int32{protocol.MsgTransactionCommit, protocol.MsgTransactionRollback} {
		resp := c.end(rh, how)
		assert.Equal(t, protocol.SystemError, resp.ResponseCode())
		assert.Contains(t, resp.Remark, "already resolved")
	}
	assert.Equal(t, int64(1), b.StoreMax("tx", 0))
}

func TestTransactionRollbackDeliversNothing(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	rh := c.sendHalf("tx", "rolled back")
	resp := c.end(rh, protocol.MsgTransactionRollback)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	assert.Zero(t, b.PendingTransactions())
	resp = c.end(rh, protocol.MsgTransactionCommit)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "already resolved")
	// A normal message afterwards is the topic's first.
	assert.Zero(t, c.sendTo("tx", 0, "normal").QueueOffset)
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	msgs := c.pullAll("tx")
	require.Len(t, msgs, 1)
	assert.Equal(t, "normal", string(msgs[0].Body))
}

func TestEndTransactionForUnknownOrMismatchedHalfMessagesIsRefused(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	rh := c.sendHalf("tx", "half")

	unknown := *rh
	unknown.QueueOffset = 7
	resp := c.end(&unknown, protocol.MsgTransactionCommit)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "no half message at that offset")

	// Another group, or another commit-log offset, cannot resolve it.
	other := c.endHeader(rh.QueueOffset, rh.MsgID, protocol.MsgTransactionCommit, false)
	other.ProducerGroup = "someone-else"
	resp = c.invoke(context.Background(), protocol.EndTransaction, other, nil)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "producer group")
	other = c.endHeader(rh.QueueOffset, rh.MsgID, protocol.MsgTransactionCommit, false)
	other.CommitLogOffset++
	resp = c.invoke(context.Background(), protocol.EndTransaction, other, nil)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	// Unknown outcome and a bad type change nothing either.
	resp = c.end(rh, protocol.MsgTransactionNone)
	assert.Equal(t, protocol.Success, resp.ResponseCode())
	resp = c.end(rh, 3)
	assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
	assert.Equal(t, 1, b.PendingTransactions())
	assert.Zero(t, b.StoreMax("tx", 0))

	// It is still pending: the right request commits it.
	resp = c.end(rh, protocol.MsgTransactionCommit)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
}

// Concurrent END_TRANSACTIONs for one half message store it once.
func TestConcurrentCommitsStoreOnce(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	rh := c.sendHalf("tx", "once")
	var wg sync.WaitGroup
	codes := make(chan protocol.ResponseCode, 8)
	for range 8 {
		wg.Go(func() {
			resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.EndTransaction, c.endHeader(rh.QueueOffset, rh.MsgID, protocol.MsgTransactionCommit, false), nil))
			if assert.NoError(t, err) {
				codes <- resp.ResponseCode()
			}
		})
	}
	wg.Wait()
	close(codes)
	ok := 0
	for code := range codes {
		if code == protocol.Success {
			ok++
		}
	}
	assert.Equal(t, 1, ok)
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Len(t, c.pullAll("tx"), 1)
}

func TestHalfMessagesInBatchesAndRolledBackSendsAreRefused(t *testing.T) {
	b := startBroker(t, nil)
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	batch := func(sysFlag int32, props map[string]string) *protocol.Command {
		body, err := protocol.EncodeBatch([]*protocol.Message{{Topic: "tx", Body: []byte("b0")}, {Topic: "tx", Body: []byte("b1"), Properties: props}})
		require.NoError(t, err)
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "tx", SysFlag: sysFlag, BornTimestamp: 1, Batch: true}
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, h.EncodeV2(), body))
		require.NoError(t, err)
		return resp
	}
	for name, resp := range map[string]*protocol.Command{
		"prepared batch":              batch(protocol.MsgTransactionPrepared, nil),
		"batch with a prepared entry": batch(0, map[string]string{protocol.PropertyTransactionPrepared: "true"}),
	} {
		assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode(), name)
		assert.Contains(t, resp.Remark, "cannot be batched", name)
	}
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "tx-new", DefaultTopic: protocol.AutoCreateTopicKey, DefaultTopicQueueNums: 4, SysFlag: protocol.MsgTransactionRollback, BornTimestamp: 1}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte("rolled back"))
	assert.Equal(t, protocol.MessageIllegal, resp.ResponseCode())
	_, exists := b.Topic("tx-new")
	assert.False(t, exists, "a refused send creates no topic")
	assert.Zero(t, b.StoreMax("tx", 0))
	assert.Zero(t, b.PendingTransactions())
}

// A producer that answers "unknown" is asked again, and its commit from the check-back
// delivers the message.
func TestUnknownTransactionIsCheckedBackAndCommitted(t *testing.T) {
	b := startBroker(t, txnConfig(50*time.Millisecond, 20*time.Millisecond, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	var checked sync.Once
	c.setAnswer(func(h *protocol.CheckTransactionStateRequestHeader, m *protocol.MessageExt) {
		checked.Do(func() {
			assert.Equal(t, "tx", m.Topic, "the check carries the real topic")
			assert.Equal(t, "checked", string(m.Body))
			assert.Equal(t, "U-checked", h.MsgID)
			assert.Equal(t, "1", m.Properties[protocol.PropertyTransactionCheckTimes])
			c.endOneway(c.endHeader(h.TranStateTableOffset, h.OffsetMsgID, protocol.MsgTransactionCommit, true))
		})
	})
	rh := c.sendHalf("tx", "checked")
	require.Equal(t, protocol.Success, c.end(rh, protocol.MsgTransactionNone).ResponseCode())
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return b.PendingTransactions() == 0 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, rh.QueueOffset, c.checkOffsets()[0])
	msgs := c.pullAll("tx")
	require.Len(t, msgs, 1)
	assert.Equal(t, "checked", string(msgs[0].Body))
}

// A half message nobody resolves is checked TransactionCheckMax times, then discarded with
// an event; it can no longer be committed.
func TestTransactionCheckExhaustedDiscardsAndEmitsAnEvent(t *testing.T) {
	b := startBroker(t, txnConfig(20*time.Millisecond, 20*time.Millisecond, 2))
	events := make(chan broker.Event, 16)
	cancel := b.Subscribe(func(e broker.Event) {
		if e.Type == broker.TransactionDiscarded {
			events <- e
		}
	})
	defer cancel()
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	rh := c.sendHalf("tx", "forgotten")

	var e broker.Event
	select {
	case e = <-events:
	case <-time.After(10 * time.Second):
		t.Fatal("no transaction.discarded event")
	}
	assert.Equal(t, "transaction.discarded", e.Type.String())
	assert.Equal(t, "tx", e.Topic)
	assert.Equal(t, "tx-producers", e.Group)
	assert.Equal(t, rh.QueueOffset, e.Offset)
	assert.Contains(t, e.Reason, "2 check-backs")
	require.Eventually(t, func() bool { return len(c.checkOffsets()) == 2 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, []int64{rh.QueueOffset, rh.QueueOffset}, c.checkOffsets())
	assert.Zero(t, b.PendingTransactions())

	resp := c.end(rh, protocol.MsgTransactionCommit)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "already resolved")
	assert.Zero(t, b.StoreMax("tx", 0))
}

// The op topic is the durable record: after a restart the pending half message is still
// checked back, and the committed one is neither checked nor delivered again.
func TestPendingTransactionsSurviveABrokerRestart(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	dir := b.cfg.DataDir
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	committed := c.sendHalf("tx", "committed")
	pending := c.sendHalf("tx", "pending")
	require.Equal(t, protocol.Success, c.end(committed, protocol.MsgTransactionCommit).ResponseCode())
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	b.stop(t)

	b2 := startBroker(t, func(cfg *broker.Config) {
		cfg.DataDir = dir
		txnConfig(20*time.Millisecond, 20*time.Millisecond, 15)(cfg)
	})
	assert.Equal(t, 1, b2.PendingTransactions())
	c2 := newTxnClient(t, b2, "tx-producers")
	var once sync.Once
	c2.setAnswer(func(h *protocol.CheckTransactionStateRequestHeader, _ *protocol.MessageExt) {
		once.Do(func() {
			c2.endOneway(c2.endHeader(h.TranStateTableOffset, h.OffsetMsgID, protocol.MsgTransactionCommit, true))
		})
	})
	require.Eventually(t, func() bool { return b2.StoreMax("tx", 0) == 2 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return b2.PendingTransactions() == 0 }, 5*time.Second, time.Millisecond)
	for _, off := range c2.checkOffsets() {
		assert.Equal(t, pending.QueueOffset, off, "only the pending half message is checked")
	}
	msgs := c2.pullAll("tx")
	require.Len(t, msgs, 2)
	assert.Equal(t, "committed", string(msgs[0].Body))
	assert.Equal(t, "pending", string(msgs[1].Body))

	// And the commit survives the next restart: nothing is pending or delivered again.
	b2.stop(t)
	b3 := startBroker(t, func(cfg *broker.Config) { cfg.DataDir = dir })
	assert.Zero(t, b3.PendingTransactions())
	assert.Equal(t, int64(2), b3.StoreMax("tx", 0))
}

// CHECK_IMMUNITY_TIME_IN_SECONDS delays a half message's first check-back.
func TestCheckImmunityDelaysTheFirstCheckBack(t *testing.T) {
	b := startBroker(t, txnConfig(20*time.Millisecond, 20*time.Millisecond, 1000))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	props := map[string]string{
		protocol.PropertyTransactionPrepared: "true", protocol.PropertyProducerGroup: c.group,
		protocol.PropertyCheckImmunityTime: "3600",
	}
	h := &protocol.SendMessageRequestHeader{ProducerGroup: c.group, Topic: "tx", SysFlag: protocol.MsgTransactionPrepared, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props)}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte("immune"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var immune protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&immune))
	plain := c.sendHalf("tx", "plain")

	require.Eventually(t, func() bool { return len(c.checkOffsets()) >= 3 }, 10*time.Second, time.Millisecond)
	for _, off := range c.checkOffsets() {
		assert.Equal(t, plain.QueueOffset, off)
	}
	assert.Equal(t, 2, b.PendingTransactions())
	require.Equal(t, protocol.Success, c.end(&immune, protocol.MsgTransactionRollback).ResponseCode())
}

// A committed message with a delay level is delayed from the commit on, like any other.
func TestCommittedTransactionHonoursItsDelayLevel(t *testing.T) {
	b := startBroker(t, txnConfig(time.Hour, time.Hour, 15))
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	props := map[string]string{protocol.PropertyTransactionPrepared: "true", protocol.PropertyProducerGroup: c.group, protocol.PropertyDelayLevel: "1"}
	h := &protocol.SendMessageRequestHeader{ProducerGroup: c.group, Topic: "tx", SysFlag: protocol.MsgTransactionPrepared, BornTimestamp: time.Now().UnixMilli(), Properties: protocol.EncodeProperties(props)}
	resp := c.invoke(context.Background(), protocol.SendMessage, h, []byte("delayed"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var rh protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	assert.Zero(t, b.StoreMax(broker.ScheduleTopic, 0), "not delayed before the commit")

	require.Equal(t, protocol.Success, c.end(&rh, protocol.MsgTransactionCommit).ResponseCode())
	require.Eventually(t, func() bool { return b.StoreMax(broker.ScheduleTopic, 0) == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 10*time.Second, time.Millisecond)
	msgs := c.pullAll("tx")
	require.Len(t, msgs, 1)
	assert.Equal(t, "delayed", string(msgs[0].Body))
}

// A power cut (the fault-injecting file system drops every unsynced write) loses nothing of
// the half-message table that a producer was told about in sync flush mode: the pending half
// message is pending again after recovery, and the committed one is not.
func TestPendingTransactionsSurviveAPowerCut(t *testing.T) {
	dir := t.TempDir()
	ffs := vfs.NewFaultFS(nil)
	ffs.TrackUnsynced()
	b := openBroker(t, dir, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
		txnConfig(time.Hour, time.Hour, 15)(cfg)
	})
	c := newTxnClient(t, b, "tx-producers")
	c.createTopic("tx", 1)
	committed := c.sendHalf("tx", "committed")
	c.sendHalf("tx", "pending")
	require.Equal(t, protocol.Success, c.end(committed, protocol.MsgTransactionCommit).ResponseCode())
	require.Eventually(t, func() bool { return b.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, ffs.Crash())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = b.Shutdown(ctx) // fails: the file system is gone

	b2 := openBroker(t, dir, txnConfig(time.Hour, time.Hour, 15))
	t.Cleanup(func() { _ = b2.Shutdown(context.Background()) })
	assert.Equal(t, 1, b2.PendingTransactions(), "the pending half message is pending again")
	require.Eventually(t, func() bool { return b2.StoreMax("tx", 0) == 1 }, 5*time.Second, time.Millisecond)
	msgs := newTxnClient(t, b2, "tx-producers").pullAll("tx")
	require.Len(t, msgs, 1, "the commit is stored once")
	assert.Equal(t, "committed", string(msgs[0].Body))
}
