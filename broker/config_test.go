package broker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/protocol"
)

func TestValidateTopic(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"orders", true},
		{"a", true},
		{"%RETRY%group-1", true},
		{"with|pipe_and-dash", true},
		{string(make([]byte, 127)), false},
		{"", false},
		{"has space", false},
		{"slash/topic", false},
		{"dot.topic", false},
		{"ünïcode", false},
	} {
		err := ValidateTopic(tc.name)
		if tc.ok {
			assert.NoError(t, err, tc.name)
		} else {
			assert.ErrorIs(t, err, ErrBadTopic, tc.name)
		}
	}
	long := make([]byte, 128)
	for i := range long {
		long[i] = 'a'
	}
	assert.NoError(t, ValidateTopic(string(long[:127])))
	assert.ErrorIs(t, ValidateTopic(string(long)), ErrBadTopic)
}

func TestParseDelayLevels(t *testing.T) {
	d, err := parseDelayLevels(DefaultDelayLevels)
	require.NoError(t, err)
	require.Len(t, d, 18)
	assert.Equal(t, time.Second, d[0])
	assert.Equal(t, 2*time.Hour, d[17])

	d, err = parseDelayLevels("100ms 2d")
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{100 * time.Millisecond, 48 * time.Hour}, d)

	for _, bad := range []string{"", "   ", "1s x", "-1s", "0s"} {
		_, err := parseDelayLevels(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	cfg, err := (&Config{}).withDefaults()
	require.NoError(t, err)
	assert.Equal(t, "./flowd-data", cfg.DataDir)
	assert.Equal(t, "127.0.0.1:10911", cfg.Listen)
	assert.Equal(t, "127.0.0.1:9876", cfg.NamesrvListen)
	assert.Equal(t, "local", cfg.Cluster)
	assert.Equal(t, 4, cfg.DefaultTopicQueues)
	assert.Equal(t, 4<<20, cfg.MaxMessageSize)
	assert.Equal(t, 45*time.Second, cfg.ClientExpiry)
	assert.Equal(t, 10000, cfg.MaxGroups)
	assert.Equal(t, 7*24*time.Hour, cfg.GroupRetention)
	assert.Equal(t, 200*time.Millisecond, cfg.TableFlushInterval)
	assert.Equal(t, 4096, cfg.EventQueueSize)
	_, err = (&Config{MaxGroups: -1}).withDefaults()
	assert.ErrorContains(t, err, "MaxGroups")

	_, err = (&Config{DefaultTopicQueues: 5000}).withDefaults()
	assert.ErrorContains(t, err, "DefaultTopicQueues")
	_, err = (&Config{BrokerName: "a b"}).withDefaults()
	assert.ErrorContains(t, err, "broker name")
	_, err = New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off", DelayLevels: "soon"})
	assert.ErrorContains(t, err, "soon")
}

func TestTopicTablePersistsAndRejectsBadConfigs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topics.json")
	tt, err := openTopicTable(path, 100)
	require.NoError(t, err)
	created, err := tt.put(TopicConfig{Name: "orders", ReadQueueNums: 8, WriteQueueNums: 8, Perm: protocol.PermRead | protocol.PermWrite})
	require.NoError(t, err)
	assert.True(t, created)
	created, err = tt.put(TopicConfig{Name: "orders", ReadQueueNums: 8, WriteQueueNums: 8, Perm: protocol.PermRead | protocol.PermWrite})
	require.NoError(t, err)
	assert.False(t, created, "the same config again is not a creation")

	for _, bad := range []TopicConfig{
		{Name: "bad name", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6},
		{Name: "zero", ReadQueueNums: 0, WriteQueueNums: 1, Perm: 6},
		{Name: "huge", ReadQueueNums: 1, WriteQueueNums: 100000, Perm: 6},
		{Name: "perm", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 64},
	} {
		_, err := tt.put(bad)
		assert.ErrorIs(t, err, ErrBadTopic, bad.Name)
	}

	again, err := openTopicTable(path, 100)
	require.NoError(t, err)
	tc, ok := again.get("orders")
	require.True(t, ok)
	assert.Equal(t, 8, tc.WriteQueueNums)
	_, ok = again.get("zero")
	assert.False(t, ok, "a refused topic is not persisted")
}

func TestOffsetTableFlushesAndReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "consumerOffset.json")
	ot, err := openOffsetTable(path, nil)
	require.NoError(t, err)
	ot.commit("g", "t", 3, 42, time.Now(), nil)
	ot.commit("g", "t", 0, 7, time.Now(), nil)
	require.NoError(t, ot.flush())

	again, err := openOffsetTable(path, nil)
	require.NoError(t, err)
	off, ok := again.query("g", "t", 3)
	assert.True(t, ok)
	assert.Equal(t, int64(42), off)
	_, ok = again.query("g", "t", 1)
	assert.False(t, ok)
	assert.Equal(t, map[int32]int64{0: 7, 3: 42}, again.groupOffsets("g", "t"))
}

func TestLockTableLeasesAndRelease(t *testing.T) {
	lt := newLockTable(time.Minute)
	now := time.Now()
	q0, q1 := protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}, protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: 1}
	assert.Equal(t, []protocol.MessageQueue{q0, q1}, lt.lock("g", "c1", []protocol.MessageQueue{q0, q1}, now))
	assert.Empty(t, lt.lock("g", "c2", []protocol.MessageQueue{q0, q1}, now.Add(time.Second)), "held by c1")
	assert.Equal(t, []protocol.MessageQueue{q0}, lt.lock("g", "c2", []protocol.MessageQueue{q0}, now.Add(2*time.Minute)), "c1's lease ran out")
	lt.unlock("g", "c2", []protocol.MessageQueue{q1}) // not c2's: no effect
	assert.Equal(t, map[protocol.MessageQueue]string{q0: "c2"}, lt.held("g", now.Add(2*time.Minute)))
	lt.releaseClient("g", "c2")
	assert.Empty(t, lt.held("g", now.Add(2*time.Minute)))
	assert.Equal(t, []protocol.MessageQueue{q1}, lt.lock("g2", "c3", []protocol.MessageQueue{q1}, now), "another group's locks do not interfere")
}

func TestParseTagExpression(t *testing.T) {
	assert.Nil(t, protocol.ParseTagExpression("*"))
	assert.Nil(t, protocol.ParseTagExpression("  "))
	assert.Equal(t, []string{"a", "b"}, protocol.ParseTagExpression(" a || b ||  || a"))
	reg := filter.NewRegistry(0)
	f, err := reg.Filter(context.Background(), filter.Subscription{ExpressionType: "TAG", Expression: "a||b"})
	require.NoError(t, err)
	assert.True(t, f.MatchTagsCode(protocol.TagsCode("b")))
	assert.False(t, f.MatchTagsCode(protocol.TagsCode("c")))
	_, err = reg.Filter(context.Background(), filter.Subscription{ExpressionType: "SQL92", Expression: "a > 1"})
	assert.ErrorContains(t, err, "SQL92")
	_, err = reg.Filter(context.Background(), filter.Subscription{ExpressionType: "XPATH", Expression: "x"})
	assert.ErrorContains(t, err, "XPATH")
}
