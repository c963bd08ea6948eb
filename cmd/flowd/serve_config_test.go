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
}
