package producer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/flowd-io/flowd/internal/client"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/remoting"
)

func TestAvoidPrefersAnotherBroker(t *testing.T) {
	a0 := MessageQueue{Topic: "t", BrokerName: "a", QueueID: 0}
	a1 := MessageQueue{Topic: "t", BrokerName: "a", QueueID: 1}
	b0 := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	assert.Equal(t, []MessageQueue{b0}, avoid([]MessageQueue{a0, a1, b0}, a0))
	assert.Equal(t, []MessageQueue{a1}, avoid([]MessageQueue{a0, a1}, a0))
	assert.Equal(t, []MessageQueue{a0}, avoid([]MessageQueue{a0}, a0))
}

func TestRetriable(t *testing.T) {
	be := func(c protocol.ResponseCode) error { return fmt.Errorf("x: %w", &client.BrokerError{Code: c}) }
	assert.True(t, retriable(be(protocol.SystemBusy)))
	assert.True(t, retriable(be(protocol.ServiceNotAvailable)))
	assert.True(t, retriable(be(protocol.SystemError)))
	assert.False(t, retriable(be(protocol.MessageIllegal)))
	assert.True(t, retriable(errors.New("connection reset")))
	assert.False(t, retriable(fmt.Errorf("x: %w", remoting.ErrClientClosed)), "the producer is closing")
	assert.False(t, retriable(fmt.Errorf("x: %w", client.ErrClosed)))
	assert.False(t, retriable(fmt.Errorf("x: %w", context.DeadlineExceeded)))
}

func TestUniqIDShape(t *testing.T) {
	g := newUniqGen("10.0.0.1")
	a, b := g.next(), g.next()
	assert.Len(t, a, 32)
	assert.NotEqual(t, a, b)
	assert.Equal(t, "0A000001", a[:8], "starts with the client address")
	assert.Equal(t, a[:20], b[:20], "fixed prefix")
}
