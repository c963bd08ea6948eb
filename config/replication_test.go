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

// Reads from replicas are off by default (RocketMQ's slaveReadEnable); the memory the
// in-memory ratio applies to is the machine's unless set, the ratio RocketMQ's 40 %.
func TestReplicaReadsAndTheMemoryBudgetDecodeAndAreValidated(t *testing.T) {
	def := config.Default()
	assert.False(t, def.Replication.ReplicaReads)
	assert.Equal(t, config.Size(0), def.Store.MemoryBudget)
	assert.Equal(t, 40, def.Store.AccessMessageInMemoryMaxRatio)

	cfg, err := config.Decode([]byte("replication:\n  replica_reads: true\nstore:\n  memory_budget: 64MiB\n  access_message_in_memory_max_ratio: 25\n"))
	require.NoError(t, err)
	assert.True(t, cfg.Replication.ReplicaReads)
	assert.Equal(t, config.Size(64<<20), cfg.Store.MemoryBudget)
	assert.Equal(t, 25, cfg.Store.AccessMessageInMemoryMaxRatio)

	cfg, err = config.Load("", []string{"FLOWD_REPLICA_READS=true", "FLOWD_MEMORY_BUDGET=1GiB", "FLOWD_ACCESS_MESSAGE_IN_MEMORY_MAX_RATIO=10"})
	require.NoError(t, err)
	assert.True(t, cfg.Replication.ReplicaReads)
	assert.Equal(t, config.Size(1<<30), cfg.Store.MemoryBudget)
	assert.Equal(t, 10, cfg.Store.AccessMessageInMemoryMaxRatio)

	_, err = config.Decode([]byte("replication:\n  replica_read: true\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `replication.replica_read: unknown key; did you mean "replica_reads"?`)

	for _, bad := range []struct {
		doc, want string
	}{
		{"store:\n  access_message_in_memory_max_ratio: 0\n", "store.access_message_in_memory_max_ratio: must be a percentage from 1 to 100, not 0"},
		{"store:\n  access_message_in_memory_max_ratio: 101\n", "store.access_message_in_memory_max_ratio: must be a percentage from 1 to 100, not 101"},
		{"store:\n  memory_budget: -1\n", "store.memory_budget"},
	} {
		cfg, err := config.Decode([]byte(bad.doc))
		if err == nil { // a value that decodes but cannot work
			err = cfg.Validate()
		}
		require.ErrorIs(t, err, config.ErrInvalid, bad.doc)
		assert.Contains(t, err.Error(), bad.want)
	}
}
