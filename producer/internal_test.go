package producer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
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
	be := func(c protocol.ResponseCode) error { return fmt.Errorf("x: %w", &clientcore.BrokerError{Code: c}) }
	assert.True(t, retriable(be(protocol.SystemBusy)))
	assert.True(t, retriable(be(protocol.ServiceNotAvailable)))
	assert.True(t, retriable(be(protocol.SystemError)))
	assert.False(t, retriable(be(protocol.MessageIllegal)))
	assert.True(t, retriable(errors.New("connection reset")))
	assert.False(t, retriable(fmt.Errorf("x: %w", remoting.ErrClientClosed)), "the producer is closing")
	assert.False(t, retriable(fmt.Errorf("x: %w", clientcore.ErrClosed)))
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

// The id's time part is the milliseconds since the start of the local month, as RocketMQ's.
func TestUniqIDTime(t *testing.T) {
	g := newUniqGen("10.0.0.1")
	for range 2 { // the second from the cached month
		before := time.Now()
		id := g.next()
		after := time.Now()
		ms, err := strconv.ParseUint(id[20:28], 16, 32)
		require.NoError(t, err)
		start := time.Date(before.Year(), before.Month(), 1, 0, 0, 0, 0, before.Location())
		assert.GreaterOrEqual(t, int64(ms), before.UnixMilli()-start.UnixMilli())
		assert.LessOrEqual(t, int64(ms), after.UnixMilli()-start.UnixMilli())
	}
}

// encodeProperties gives the properties the message's own map, then its fields, then the
// extra ones set, each later one taking precedence; the message's own keys come sorted.
func TestEncodeProperties(t *testing.T) {
	msg := &Message{
		Topic: "t", Tags: "tagA", Keys: []string{"k1", "k2"}, DelayLevel: 3,
		Properties: map[string]string{"b": "2", "a": "1", protocol.PropertyTags: "overridden", "x": "own"},
	}
	s, at := encodeProperties(msg, []byte("UNIQ"), []string{"x", "extra", protocol.PropertyProducerGroup, "g"})
	assert.Equal(t, "UNIQ", s[at:at+4], "the id's place in the encoding")
	got, err := protocol.DecodeProperties([]byte(s))
	assert.NoError(t, err)
	assert.Equal(t, map[string]string{
		"a": "1", "b": "2", "x": "extra", protocol.PropertyTags: "tagA", protocol.PropertyKeys: "k1 k2",
		protocol.PropertyDelayLevel: "3", protocol.PropertyUniqueKey: "UNIQ", protocol.PropertyWaitStoreOK: "true",
		protocol.PropertyProducerGroup: "g",
	}, got)
	assert.True(t, len(s) > 4 && s[:4] == "a\x011\x02", "own keys sorted first: %q", s)
	assert.Equal(t, strings.Count(s, "\x02"), len(got), "each key once")

	bare, _ := encodeProperties(&Message{Topic: "t"}, []byte("U"), nil)
	assert.Equal(t, "UNIQ_KEY\x01U\x02WAIT\x01true\x02", bare)
}
