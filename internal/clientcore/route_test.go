package clientcore

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// A route keeps every member of a replica set, not only the master: pulls may go to a
// replica (RocketMQ's findBrokerAddressInSubscribe).
func TestRouteKeepsEveryMemberAndFindsOneToPullFrom(t *testing.T) {
	route := &protocol.TopicRouteData{
		QueueDatas: []protocol.QueueData{
			{BrokerName: "a", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite},
			{BrokerName: "b", ReadQueueNums: 1, WriteQueueNums: 1, Perm: protocol.PermRead | protocol.PermWrite},
		},
		BrokerDatas: []protocol.BrokerData{
			{Cluster: "c", BrokerName: "a", BrokerAddrs: map[int64]string{3: "127.0.0.1:13", protocol.MasterID: "127.0.0.1:10", 2: "127.0.0.1:12", 4: ""}},
			{Cluster: "c", BrokerName: "b", BrokerAddrs: map[int64]string{3: "127.0.0.1:23", 2: "127.0.0.1:22"}}, // no master now
		},
	}
	r := NewRoute("t", route)
	assert.Equal(t, []Member{{0, "127.0.0.1:10"}, {2, "127.0.0.1:12"}, {3, "127.0.0.1:13"}}, r.Members("a"), "by id, empty addresses left out")
	addr, ok := r.SubscribeAddr("a", 3)
	assert.True(t, ok)
	assert.Equal(t, "127.0.0.1:13", addr)
	_, ok = r.SubscribeAddr("a", 4)
	assert.False(t, ok)
	_, ok = r.BrokerAddr("b")
	assert.False(t, ok, "b has no master")
	assert.Equal(t, []protocol.MessageQueue{{Topic: "t", BrokerName: "a"}}, r.PublishQueues)
	assert.Len(t, r.SubscribeQueues, 2, "b's queues are still readable, from its replicas")

	// Routes that differ only in their replicas are different routes.
	other := *route
	other.BrokerDatas = []protocol.BrokerData{route.BrokerDatas[0], {Cluster: "c", BrokerName: "b", BrokerAddrs: map[int64]string{2: "127.0.0.1:22"}}}
	assert.False(t, r.sameAs(NewRoute("t", &other)))
	assert.True(t, r.sameAs(NewRoute("t", route)))

	// The client finds them in its cached routes, and asks the name server only for a
	// broker no route names.
	body, err := route.Encode()
	require.NoError(t, err)
	var asked atomic.Int32
	srv := remoting.NewServer(remoting.HandlerFunc(func(ctx context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
		asked.Add(1)
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = body
		return resp
	}), remoting.ServerOptions{Logger: quietLogger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := newClientAt(t, ln.Addr().String())
	_, ok = c.SubscribeAddr("a", 2)
	assert.False(t, ok, "nothing cached yet")
	ctx := context.Background()
	for _, tc := range []struct {
		broker   string
		id, want int64
		addr     string
	}{
		{"a", 2, 2, "127.0.0.1:12"},
		{"a", 0, 0, "127.0.0.1:10"},
		{"a", 7, 0, "127.0.0.1:10"}, // unknown member: the master
		{"b", 3, 3, "127.0.0.1:23"}, // a replica of a set without master
		{"b", 0, 2, "127.0.0.1:22"}, // no master: the lowest id
		{"b", 9, 2, "127.0.0.1:22"}, // neither
	} {
		addr, id, err := c.FindSubscribeAddr(ctx, tc.broker, "t", tc.id)
		require.NoError(t, err)
		assert.Equal(t, tc.want, id, "%s/%d", tc.broker, tc.id)
		assert.Equal(t, tc.addr, addr, "%s/%d", tc.broker, tc.id)
	}
	assert.Equal(t, int32(1), asked.Load(), "one route fetch, then the cache")
	addr, ok = c.SubscribeAddr("b", 2)
	assert.True(t, ok)
	assert.Equal(t, "127.0.0.1:22", addr)
	_, _, err = c.FindSubscribeAddr(ctx, "z", "t", 0)
	require.ErrorIs(t, err, ErrBrokerNotFound)
}
