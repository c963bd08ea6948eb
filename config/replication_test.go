package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
)

func TestReplicationIsOffByDefaultAndDecodes(t *testing.T) {
	def := config.Default()
	assert.False(t, def.Replication.Enabled())
	assert.Equal(t, 2, def.Replication.MinInSync)
	assert.Equal(t, 3*time.Second, def.Replication.LeaseTTL)

	path := writeConfig(t, "nats:\n  cluster:\n    listen: 127.0.0.1:6222\nlisten:\n  ha: 127.0.0.1:0\n"+
		"replication:\n  mode: sync\n  broker_id: 2\n  min_in_sync: 3\n  lease_ttl: 1s\n")
	cfg, err := config.Load(path, nil)
	require.NoError(t, err)
	assert.True(t, cfg.Replication.Enabled())
	assert.Equal(t, int64(2), cfg.Replication.BrokerID)
	assert.Equal(t, 3, cfg.Replication.MinInSync)
	assert.Equal(t, "127.0.0.1:0", cfg.Listen.HA)

	cfg, err = config.Load("", []string{"FLOWD_REPLICATION=async", "FLOWD_BROKER_ID=1", "FLOWD_NATS_URL=nats://127.0.0.1:4333"})
	require.NoError(t, err)
	assert.Equal(t, "async", cfg.Replication.Mode)
}

func TestReplicationSettingsAreValidated(t *testing.T) {
	for _, c := range []struct {
		doc, key string
	}{
		{"replication:\n  mode: quorum\n", "replication.mode"},
		{"replication:\n  mode: sync\n  broker_id: 1\n", "replication.mode"}, // no cluster
		{"nats:\n  cluster:\n    listen: 127.0.0.1:6222\nreplication:\n  mode: sync\n", "replication.broker_id"},
		{"nats:\n  cluster:\n    listen: 127.0.0.1:6222\nreplication:\n  mode: sync\n  broker_id: 1\n  min_in_sync: 0\n", "replication.min_in_sync"},
		{"nats:\n  cluster:\n    listen: 127.0.0.1:6222\nreplication:\n  mode: sync\n  broker_id: 1\n  lease_ttl: 10ms\n", "replication.lease_ttl"},
		{"nats:\n  cluster:\n    listen: 127.0.0.1:6222\nlisten:\n  ha: nowhere\nreplication:\n  mode: async\n  broker_id: 1\n", "listen.ha"},
	} {
		_, err := config.Load(writeConfig(t, c.doc), nil)
		require.Error(t, err, c.doc)
		assert.Contains(t, err.Error(), c.key, c.doc)
	}
}
