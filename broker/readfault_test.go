package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/broker/store/vfs"
	"github.com/flowd-io/flowd/protocol"
)

// readFaultBroker stores ten messages in rf/0 on a broker whose commit log then fails every
// read of the fifth one, until ffs.FailReads(nil).
func readFaultBroker(t *testing.T, zeroCopy bool) (b *testBroker, c *rawClient, ffs *vfs.FaultFS) {
	t.Helper()
	ffs = vfs.NewFaultFS(nil)
	const seg = 8 << 20
	b = startBroker(t, func(c *broker.Config) {
		c.Store.FS = ffs
		c.Store.SegmentSize = seg
		c.DisableZeroCopy = !zeroCopy
	})
	c = newRawClient(t, b, nil)
	var from, to int64
	for i := range 10 {
		if i == 4 {
			from = b.StoreStats().CommitLogMaxOffset
		}
		c.send("rf", fmt.Sprint("m", i), "")
		if i == 4 {
			to = b.StoreStats().CommitLogMaxOffset
		}
	}
	require.Eventually(t, func() bool { return b.StoreMax("rf", 0) == 10 }, 10*time.Second, 5*time.Millisecond)
	ffs.FailReads(&vfs.ReadFault{Match: func(n string) bool { return strings.Contains(n, "/commitlog/") }, Off: from % seg, Len: to - from})
	return b, c, ffs
}

// pullRF pulls rf/0 from offset and returns the answer's code, remark, next offset (-1 for
// an error answer) and the bodies of its messages.
func pullRF(t *testing.T, c *rawClient, offset int64) (protocol.ResponseCode, string, int64, []string) {
	t.Helper()
	resp := c.invoke(context.Background(), protocol.PullMessage, pullHeader("rf", offset, 0, "*"), nil)
	if resp.ResponseCode() == protocol.SystemError {
		return resp.ResponseCode(), resp.Remark, -1, nil
	}
	var rh protocol.PullMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&rh))
	var bodies []string
	if resp.ResponseCode() == protocol.Success {
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		for _, m := range msgs {
			bodies = append(bodies, string(m.Body))
		}
	}
	return resp.ResponseCode(), resp.Remark, rh.NextBeginOffset, bodies
}

// A message the store cannot read ends a pull's batch, and a pull from it is answered
// SYSTEM_ERROR (which clients retry from the same offset) with a remark that says so, until
// the disk reads again. Before, the broker answered with the messages after it and
// nextBeginOffset 10: the consumer moved past what it never received.
func TestPullOfAnUnreadableMessageIsRetried(t *testing.T) {
	b, c, ffs := readFaultBroker(t, false)
	code, remark, next, got := pullRF(t, c, 0)
	require.Equal(t, protocol.Success, code, remark)
	assert.Equal(t, []string{"m0", "m1", "m2", "m3"}, got)
	assert.EqualValues(t, 4, next)

	code, remark, _, _ = pullRF(t, c, 4)
	assert.Equal(t, protocol.SystemError, code)
	assert.Contains(t, remark, "rf/0 from offset 4")
	assert.Contains(t, remark, "nothing was skipped")
	assert.Contains(t, remark, "input/output error")
	assert.Positive(t, b.StoreStats().ReadErrors)

	ffs.FailReads(nil)
	code, remark, next, got = pullRF(t, c, 4)
	require.Equal(t, protocol.Success, code, remark)
	assert.Equal(t, []string{"m4", "m5", "m6", "m7", "m8", "m9"}, got)
	assert.EqualValues(t, 10, next)
}

// Answered from the files, a pull reads nothing before it answers: a region the transport
// cannot read closes the connection (the frame cannot be finished), so the client learns
// of no offset past it and pulls again from where it was.
func TestZeroCopyPullOfAnUnreadableMessage(t *testing.T) {
	b, c, ffs := readFaultBroker(t, true)
	_, err := c.cl.Invoke(context.Background(), b.Addr(), protocol.NewRequestWith(protocol.PullMessage, pullHeader("rf", 0, 0, "*"), nil))
	require.Error(t, err, "the answer cannot be sent")
	assert.Positive(t, b.StoreStats().ReadErrors)

	ffs.FailReads(nil)
	code, remark, next, got := pullRF(t, c, 0)
	require.Equal(t, protocol.Success, code, remark)
	assert.Len(t, got, 10)
	assert.EqualValues(t, 10, next)
}
