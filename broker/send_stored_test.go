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
