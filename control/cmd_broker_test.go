package control_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

func TestBrokerStatus(t *testing.T) {
	e := start(t, nil)
	p := newProducer(t, e.b)
	send(t, e.b, p, "orders", 2)
	c := newConsumer(t, e.b, "billing", "orders")
	pollN(t, c, 2)
	require.NoError(t, c.Commit(context.Background()))

	var st control.StatusReply
	e.ok("broker.status", ``, &st)
	assert.Equal(t, "broker-a", st.BrokerName)
	assert.Equal(t, e.b.Addr(), st.Addresses.Broker)
	assert.Equal(t, e.b.NamesrvAddr(), st.Addresses.Namesrv)
	assert.Equal(t, e.ns.ClientURL(), st.Addresses.NATS)
	assert.False(t, st.Started.IsZero())
	assert.Positive(t, st.UptimeSeconds)
	assert.Equal(t, len(e.b.Topics()), st.Topics)
	assert.Equal(t, 1, st.Groups)
	assert.Equal(t, 1, st.Clients)
	assert.Equal(t, 1, st.Members)
	assert.Positive(t, st.Store.CommitLogMaxOffset)
	assert.Positive(t, st.Store.ConsumeQueues)
	assert.Empty(t, st.Store.WriteFailure)
	assert.Equal(t, uint64(0), st.EventsDropped)

	assert.Contains(t, e.fail("broker.status", `{"verbose":true}`, control.CodeBadRequest), `field "verbose": unknown field`)
}
