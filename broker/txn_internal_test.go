package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
)

func TestTransactionConfigDefaultsAndLimits(t *testing.T) {
	cfg, err := (&Config{}).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, 6*time.Second, cfg.TransactionTimeout)
	assert.Equal(t, 60*time.Second, cfg.TransactionCheckInterval)
	assert.Equal(t, 15, cfg.TransactionCheckMax)
	for _, c := range []Config{{TransactionTimeout: -1}, {TransactionCheckInterval: -1}, {TransactionCheckMax: -1}} {
		_, err := c.withDefaults()
		assert.Error(t, err)
	}
}

// The producer table: heartbeats and sends register a connection, unregistering or closing
// it or going silent removes it, and the most recently seen comes first.
func TestProducerManagerTracksConnections(t *testing.T) {
	c1, c2 := new(remoting.Conn), new(remoting.Conn) // identities only: never used
	m := newProducerManager()
	now := time.Now()
	m.seen("g", "id-1", c1, now)
	m.seen("g", "", c2, now.Add(time.Second)) // a send: no client id yet
	assert.Equal(t, []*remoting.Conn{c2, c1}, m.conns("g"))
	assert.Empty(t, m.conns("other"))

	m.unregister("g", "id-1")
	assert.Equal(t, []*remoting.Conn{c2}, m.conns("g"))
	m.seen("g", "id-1", c1, now)
	m.connClosed(c2)
	assert.Equal(t, []*remoting.Conn{c1}, m.conns("g"))
	m.expire(now.Add(time.Millisecond))
	assert.Empty(t, m.conns("g"))
	assert.Empty(t, m.groups, "an empty group is forgotten")
}
