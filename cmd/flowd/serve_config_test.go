package main

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/config"
)

func TestBrokerConfigCarriesTheStoreSettings(t *testing.T) {
	c := config.Default()
	bc := brokerConfig(c, slog.Default())
	assert.Equal(t, 500*time.Millisecond, bc.OffsetFlushInterval)
	assert.False(t, bc.DisableZeroCopy)
	assert.Equal(t, store.FlushAsync, bc.Store.FlushMode)

	c.Store.OffsetFlushInterval = 3 * time.Second
	c.Store.ZeroCopy = false
	c.Store.Flush = "sync"
	bc = brokerConfig(c, slog.Default())
	assert.Equal(t, 3*time.Second, bc.OffsetFlushInterval)
	assert.True(t, bc.DisableZeroCopy)
	assert.Equal(t, store.FlushSync, bc.Store.FlushMode)

	assert.Equal(t, int64(0), bc.Store.Memory, "the machine's memory")
	assert.Equal(t, 40, bc.Store.InMemoryMaxRatio)
	assert.False(t, bc.ReplicaReads)

	c.Store.MemoryBudget = 1 << 20
	c.Store.AccessMessageInMemoryMaxRatio = 10
	c.Replication.ReplicaReads = true
	bc = brokerConfig(c, slog.Default())
	assert.Equal(t, int64(1<<20), bc.Store.Memory)
	assert.Equal(t, 10, bc.Store.InMemoryMaxRatio)
	assert.False(t, bc.ReplicaReads, "a single broker has no replica to read from")
	c.Replication.Mode = "async"
	assert.True(t, brokerConfig(c, slog.Default()).ReplicaReads)
}
