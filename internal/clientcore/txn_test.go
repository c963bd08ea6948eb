package clientcore

import (
	"context"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

type checkerFunc func(addr string, h *protocol.CheckTransactionStateRequestHeader, m *protocol.MessageExt)

func (f checkerFunc) CheckTransaction(addr string, h *protocol.CheckTransactionStateRequestHeader, m *protocol.MessageExt) {
	f(addr, h, m)
}

// A check-back goes to the checker of the half message's producer group, and to no other.
func TestCheckTransactionStateGoesToTheGroupsChecker(t *testing.T) {
	c, err := New(Options{NameServers: []string{"127.0.0.1:1"}, Logger: quietLogger()})
	require.NoError(t, err)
	defer c.Close(context.Background())
	var got []int64
	c.SetTransactionChecker("g", checkerFunc(func(_ string, h *protocol.CheckTransactionStateRequestHeader, m *protocol.MessageExt) {
		assert.Equal(t, "body", string(m.Body))
		got = append(got, h.TranStateTableOffset)
	}))
	check := func(group string, offset int64) *protocol.Command {
		m := &protocol.MessageExt{
			Message:   protocol.Message{Topic: "t", Body: []byte("body"), Properties: map[string]string{protocol.PropertyProducerGroup: group}},
			BornHost:  netip.MustParseAddrPort("127.0.0.1:1"),
			StoreHost: netip.MustParseAddrPort("127.0.0.1:2"),
		}
		body, err := protocol.AppendStored(nil, m)
		require.NoError(t, err)
		return protocol.NewRequestWith(protocol.CheckTransactionState, &protocol.CheckTransactionStateRequestHeader{TranStateTableOffset: offset, CommitLogOffset: 1}, body)
	}
	assert.Nil(t, c.serve(context.Background(), nil, check("g", 5)))
	assert.Nil(t, c.serve(context.Background(), nil, check("other", 6)))
	bad := check("g", 7)
	bad.Body = []byte("not a message")
	assert.Nil(t, c.serve(context.Background(), nil, bad))
	c.SetTransactionChecker("g", nil)
	assert.Nil(t, c.serve(context.Background(), nil, check("g", 8)))
	assert.Equal(t, []int64{5}, got)
}
