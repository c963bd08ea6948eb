package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// A send whose fsync does not finish in time is stored all the same: its FLUSH_DISK_TIMEOUT
// answer must say where, like SUCCESS, so that the client does not send it again.
func TestSendUnderASlowDiskAnswersFlushDiskTimeoutWithTheOffsets(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(func(name string) bool { return strings.Contains(name, "commitlog") })
	b := startBroker(t, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
		cfg.Store.SyncFlushTimeout = 100 * time.Millisecond
	})
	c := newRawClient(t, b, nil)
	c.createTopic("slow", 1)
	release := make(chan struct{})
	ffs.HoldSyncs(release)
	t.Cleanup(func() { close(release) })

	single := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "slow", BornTimestamp: time.Now().UnixMilli()}
	resp := c.invoke(context.Background(), protocol.SendMessage, single, []byte("one"))
	require.Equal(t, protocol.FlushDiskTimeout, resp.ResponseCode(), resp.Remark)
	var rh protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh), "the answer carries msgId, queueId and queueOffset")
	require.Equal(t, int64(0), rh.QueueOffset)
	_, at, err := protocol.ParseOffsetMsgID(rh.MsgID)
	require.NoError(t, err)
	require.Equal(t, int64(0), at)

	body, err := protocol.EncodeBatch([]*protocol.Message{{Topic: "slow", Body: []byte("b0")}, {Topic: "slow", Body: []byte("b1")}})
	require.NoError(t, err)
	batch := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "slow", BornTimestamp: time.Now().UnixMilli(), Batch: true}
	resp, err = c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendBatchMessage, batch.EncodeV2(), body))
	require.NoError(t, err)
	require.Equal(t, protocol.FlushDiskTimeout, resp.ResponseCode(), resp.Remark)
	require.NoError(t, resp.DecodeHeader(&rh))
	require.Equal(t, int64(1), rh.QueueOffset)
	require.Len(t, strings.Split(rh.MsgID, ","), 2)

	require.Eventually(t, func() bool { return b.StoreMax("slow", 0) == 3 }, 5*time.Second, 5*time.Millisecond)
}

// A SYNC_FLUSH send waiting for its fsync is not served on its connection's read goroutine
// (inline): the requests sent after it on the same connection are answered meanwhile.
func TestSyncFlushSendWaitingForItsFsyncHoldsUpNothing(t *testing.T) {
	ffs := vfs.NewFaultFS(nil)
	ffs.Match(func(name string) bool { return strings.Contains(name, "commitlog") })
	b := startBroker(t, func(cfg *broker.Config) {
		cfg.Store.FS = ffs
		cfg.Store.FlushMode = store.FlushSync
		cfg.Store.SyncFlushTimeout = time.Minute
	})
	c := newRawClient(t, b, nil)
	c.createTopic("held", 1)
	release := make(chan struct{})
	ffs.HoldSyncs(release)
	released := false
	t.Cleanup(func() {
		if !released {
			close(release)
		}
	})

	answered := make(chan *protocol.Command, 1)
	go func() {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "raw", Topic: "held", BornTimestamp: time.Now().UnixMilli()}
		resp, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte("one")))
		if err != nil {
			resp = nil
		}
		answered <- resp
	}()
	require.Eventually(t, func() bool { return b.StoreMax("held", 0) == 1 }, 5*time.Second, time.Millisecond, "the send is stored and waits for its fsync")

	// Same client, same connection: answered while the send still waits.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.cl.Invoke(ctx, b.Addr(), protocol.NewRequestWith(protocol.GetMaxOffset, &protocol.GetMaxOffsetRequestHeader{Topic: "held", QueueID: 0}, nil))
	require.NoError(t, err, "answered while the send waits for its fsync")
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	select {
	case <-answered:
		t.Fatal("the send was answered before its fsync finished")
	default:
	}
	released = true
	close(release)
	select {
	case resp := <-answered:
		require.NotNil(t, resp)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	case <-time.After(10 * time.Second):
		t.Fatal("the send was not answered once its fsync finished")
	}
}
