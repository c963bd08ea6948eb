package config_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
)

func TestDefaultsYAMLRoundTripsToDefault(t *testing.T) {
	raw, err := config.DefaultsYAML()
	require.NoError(t, err)
	cfg, err := config.Decode(raw)
	require.NoError(t, err, string(raw))
	assert.Equal(t, config.Default(), cfg)
	require.NoError(t, cfg.Validate())
	// Every setting is in the document with its comment.
	c := config.Default()
	for _, s := range config.Settings(&c) {
		assert.NotEmpty(t, s.Doc, "setting %s has no doc", s.Key)
	}
	assert.Contains(t, string(raw), "# debug, info, warn or error (env FLOWD_LOG_LEVEL, flag --log-level, reloaded on SIGHUP)")
	assert.Contains(t, string(raw), "max_message_size: 4MiB")
}

func TestDecodeKeepsDefaultsOfSettingsLeftOut(t *testing.T) {
	cfg, err := config.Decode([]byte("data_dir: /var/lib/flowd\nlimits:\n  max_message_size: 64MiB\nstore:\n  retention: 24h\n"))
	require.NoError(t, err)
	want := config.Default()
	want.DataDir = "/var/lib/flowd"
	want.Limits.MaxMessageSize = 64 << 20
	want.Store.Retention = 24 * time.Hour
	assert.Equal(t, want, cfg)

	cfg, err = config.Decode(nil)
	require.NoError(t, err)
	assert.Equal(t, config.Default(), cfg, "an empty file is all defaults")

	cfg, err = config.Decode([]byte("limits:\n  max_message_size: 1024\n"))
	require.NoError(t, err)
	assert.Equal(t, config.Size(1024), cfg.Limits.MaxMessageSize, "a size may be a byte count")

	cfg, err = config.Decode([]byte("store:\n  offset_flush_interval: 2s\n  zero_copy: false\n"))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, cfg.Store.OffsetFlushInterval)
	assert.False(t, cfg.Store.ZeroCopy)
	assert.True(t, config.Default().Store.ZeroCopy, "pulls are answered from the files by default")
}

func TestDecodeRefusesUnknownKeysAndWrongTypesWithTheirLine(t *testing.T) {
	_, err := config.Decode([]byte("cluster: local\nnats:\n  listen: 127.0.0.1:4222\n  lisen: x\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `line 4: nats.lisen: unknown key; did you mean "listen"?`)

	_, err = config.Decode([]byte("limits:\n  max_groups: many\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "line 2")
	assert.Contains(t, err.Error(), "many")

	_, err = config.Decode([]byte("store:\n  retention: forever\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "forever")

	_, err = config.Decode([]byte("limits:\n  max_message_size: 4MB\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "line 2")
	assert.Contains(t, err.Error(), `"4MB"`)

	// The key is named too: a line may hold several settings.
	cases := map[string]string{
		"limits: {max_groups: many, max_parked: many}\n": "line 1: limits.max_groups: cannot unmarshal !!str `many` into int\n  line 1: limits.max_parked: ",
		"store: {retention: 3 days}\n":                   "line 1: store.retention: cannot unmarshal !!str `3 days` into time.Duration",
		"store:\n  retention: [1]\n":                     "line 2: store.retention: cannot unmarshal !!seq into time.Duration",
		"store: {segment_size: 12 parsecs}\n":            `line 1: store.segment_size: size "12 parsecs"`,
		"log: [a]\n":                                     "line 1: log: cannot unmarshal !!seq",
		"pipelines:\n  - {name: p, topics: [t], parallelism: lots, sink: {type: stdout}}\n":   "line 2: pipelines[0].parallelism: ",
		"pipelines:\n  - {name: p, topics: [t], retry_backoff: soon, sink: {type: stdout}}\n": `line 2: pipelines[0].retry_backoff: duration "soon"`,
	}
	for doc, want := range cases {
		_, err = config.Decode([]byte(doc))
		require.ErrorIs(t, err, config.ErrInvalid, doc)
		assert.Contains(t, err.Error(), want, doc)
	}
}

func TestValidateNamesTheSetting(t *testing.T) {
	c := config.Default()
	c.Store.Flush = "sometimes"
	c.Log.Format = "xml"
	err := c.Validate()
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "store.flush")
	assert.Contains(t, err.Error(), "log.format")

	// A zero would silently become the broker's default: it is refused.
	c = config.Default()
	c.Store.Retention = 0
	c.Limits.MaxGroups = 0
	c.Store.MaxDiskUsage = 0
	c.Store.OffsetFlushInterval = 0
	err = c.Validate()
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "store.retention: must be positive")
	assert.Contains(t, err.Error(), "limits.max_groups: must be positive")
	assert.Contains(t, err.Error(), "store.max_disk_usage")
	assert.Contains(t, err.Error(), "store.offset_flush_interval: must be positive")
	// Addresses are checked before anything listens.
	c = config.Default()
	c.Listen.Broker = "127.0.0.1:notaport"
	c.Listen.Namesrv = "nohost"
	c.Listen.Advertise = "10.0.0.1:0"
	c.NATS.Listen = "127.0.0.1:70000"
	c.HTTP.Listen = ""
	err = c.Validate()
	require.ErrorIs(t, err, config.ErrInvalid)
	for _, want := range []string{`listen.broker: "127.0.0.1:notaport" has no port`, `listen.namesrv: "nohost" is not host:port, or "off"`,
		`listen.advertise: "10.0.0.1:0" is not host:port with a port in 1-65535`, `nats.listen: "127.0.0.1:70000" has no port`, `http.listen: "" is not host:port`} {
		assert.Contains(t, err.Error(), want)
	}
	c = config.Default()
	c.Listen.Broker, c.Listen.Namesrv, c.NATS.Listen, c.HTTP.Listen, c.Listen.Advertise = ":0", "off", "off", "off", "flowd.example:10911"
	assert.NoError(t, c.Validate(), "any interface, port 0, off, a host name to advertise")

	// Two listeners on one address would fail as an address in use: they are named instead.
	c = config.Default()
	c.Listen.Broker, c.Listen.Namesrv, c.NATS.Listen, c.HTTP.Listen = "127.0.0.1:9000", "127.0.0.1:9000", ":9001", "127.0.0.1:9001"
	err = c.Validate()
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `listen.namesrv: "127.0.0.1:9000" is the address of listen.broker too`)
	assert.Contains(t, err.Error(), `http.listen: "127.0.0.1:9001" is the address of nats.listen too`)
	c.NATS.Enabled = false
	c.Listen.Namesrv = "127.0.0.1:0"
	c.Listen.Broker = "127.0.0.1:0"
	assert.NoError(t, c.Validate(), "port 0 twice, and the address of a NATS listener that is not opened")

	c = config.Default()
	c.Limits.MaxConnections = -1
	c.Store.MaxDiskUsage = -1
	c.NATS.Events.OffsetInterval = -1
	assert.NoError(t, c.Validate(), "negative means no cap, no disk rule, one event per commit")
}

func TestLoadAppliesEnvironmentOverTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	require.NoError(t, os.WriteFile(path, []byte("data_dir: from-file\ncluster: filecluster\nnats:\n  disabled_commands: [topic.delete]\n"), 0o600))
	cfg, err := config.Load(path, []string{"FLOWD_DATA_DIR=from-env", "FLOWD_NATS_EVENTS_MAX_BYTES=2GiB",
		"FLOWD_PLUGIN_POLL=5s", "FLOWD_NATS_URL=nats://a:4222, nats://b:4222", "PATH=/bin", "FLOWD_NATS=false"})
	require.NoError(t, err)
	assert.Equal(t, "from-env", cfg.DataDir, "env beats the file")
	assert.Equal(t, "filecluster", cfg.Cluster, "the file beats the default")
	assert.Equal(t, []string{"topic.delete"}, cfg.NATS.Disabled)
	assert.Equal(t, config.Size(2<<30), cfg.NATS.Events.MaxBytes)
	assert.Equal(t, 5*time.Second, cfg.Plugins.Poll)
	assert.Equal(t, []string{"nats://a:4222", "nats://b:4222"}, cfg.NATS.URLs)
	assert.False(t, cfg.NATS.Enabled)

	_, err = config.Load(path, []string{"FLOWD_MAX_GROUPS=lots"})
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), "FLOWD_MAX_GROUPS")

	_, err = config.Load(filepath.Join(t.TempDir(), "missing.yaml"), nil)
	require.Error(t, err)
	assert.NotErrorIs(t, err, config.ErrInvalid)
}

func TestChangedListsDifferingSettings(t *testing.T) {
	a, b := config.Default(), config.Default()
	b.Log.Level = "debug"
	b.Listen.Broker = "127.0.0.1:1"
	var keys []string
	for _, s := range config.Changed(a, b) {
		keys = append(keys, s.Key)
	}
	assert.Equal(t, []string{"listen.broker", "log.level"}, keys)
}

func TestSizeParsesAndPrints(t *testing.T) {
	for in, want := range map[string]config.Size{"0": 0, "512B": 512, "4KiB": 4096, "64MiB": 64 << 20, "1 GiB": 1 << 30} {
		got, err := config.ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "-1", "4MB", "1.5GiB", "x"} {
		_, err := config.ParseSize(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "64MiB", config.Size(64<<20).String())
	assert.Equal(t, "1000B", config.Size(1000).String())
}

func TestPipelinesDecodeStrictlyAndValidateNamingTheField(t *testing.T) {
	raw, err := config.DefaultsYAML()
	require.NoError(t, err)
	assert.Contains(t, string(raw), "pipelines: []")

	cfg, err := config.Decode([]byte(`
pipelines:
  - name: big-orders
    topics: [orders]
    selector: {type: SQL92, expression: "amount > 100"}
    sink: {type: topic, topic: big-orders, timeout: 2s}
`))
	require.NoError(t, err)
	require.NoError(t, cfg.Validate())
	require.Len(t, cfg.Pipelines, 1)
	assert.Equal(t, "amount > 100", cfg.Pipelines[0].Selector.Expression)
	assert.Equal(t, 2*time.Second, time.Duration(cfg.Pipelines[0].Sink.Timeout))

	_, err = config.Decode([]byte("pipelines:\n  - name: p\n    topics: [a]\n    colour: red\n"))
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `line 4: pipelines[0].colour: unknown key`)

	cfg, err = config.Decode([]byte(`
pipelines:
  - name: ok
    topics: [a]
    sink: {type: stdout}
  - name: bad
    topics: [a]
    sink: {type: topic}
  - name: ok
    topics: [a]
    sink: {type: stdout}
`))
	require.NoError(t, err)
	err = cfg.Validate()
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `pipelines[1].sink.topic: "" is not a valid topic name`)
	assert.Contains(t, err.Error(), `pipelines[2].name: "ok" is the name of pipelines[0] too`)
}

// A file with several mistakes is reported whole: every unknown key (with the key meant when
// one is close, or is a setting of another section), every value of the wrong type and every
// value that decodes but cannot work, each with its line and key path, in file order.
func TestLoadReportsEveryMistakeOfAFileAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`clustr: x
limits:
  max_grops: 3
  max_parked: many
store:
  flush: sometimes
retention: 24h
log:
  level: loud
pipelines:
  - name: ok
    topics: [a]
    sink: {type: stdout}
  - name: bad
    topics: [a]
    parallelism: -1
    colour: red
    sink: {type: topic, topik: out}
`), 0o600))
	_, err := config.Load(path, nil)
	require.ErrorIs(t, err, config.ErrInvalid)
	var inv *config.InvalidError
	require.ErrorAs(t, err, &inv)
	var got []string
	for _, p := range inv.Problems {
		got = append(got, p.String())
	}
	assert.Equal(t, []string{
		`line 1: clustr: unknown key; did you mean "cluster"?`,
		`line 3: limits.max_grops: unknown key; did you mean "max_groups"?`,
		"line 4: limits.max_parked: cannot unmarshal !!str `many` into int",
		`line 6: store.flush: "sometimes" is neither async nor sync`,
		`line 7: retention: unknown key; did you mean "store.retention"?`,
		`line 9: log.level: "loud" is not debug, info, warn or error`,
		`line 16: pipelines[1].parallelism: -1 is outside [1, 1024]`,
		`line 17: pipelines[1].colour: unknown key`,
		`line 18: pipelines[1].sink.topik: unknown key; did you mean "topic"?`,
		`line 18: pipelines[1].sink.topic: "" is not a valid topic name`,
	}, got)
	assert.Contains(t, err.Error(), "config "+path+": invalid configuration:\n  line 1: clustr: ")

	// A value that does not decode is reported once, not again by the checks of what it
	// left behind.
	_, err = config.Decode([]byte("pipelines: [oops]\n"))
	require.ErrorAs(t, err, &inv)
	require.Len(t, inv.Problems, 1, err.Error())
	require.NoError(t, os.WriteFile(path, []byte("pipelines: [oops]\n"), 0o600))
	_, err = config.Load(path, nil)
	require.ErrorAs(t, err, &inv)
	assert.Len(t, inv.Problems, 1, err.Error())

	// A key of a pipeline that belongs one level down is named there.
	_, err = config.Decode([]byte("pipelines:\n  - {name: p, topics: [a], subject: x, sink: {type: nats}}\n"))
	require.ErrorAs(t, err, &inv)
	assert.Equal(t, `line 2: pipelines[0].subject: unknown key; did you mean "pipelines[0].sink.subject"?`, inv.Problems[0].String())

	// A value set by the environment is not blamed on the file's line.
	require.NoError(t, os.WriteFile(path, []byte("log:\n  level: info\n"), 0o600))
	_, err = config.Load(path, []string{"FLOWD_LOG_LEVEL=loud"})
	require.ErrorAs(t, err, &inv)
	require.Len(t, inv.Problems, 1)
	assert.Equal(t, `log.level: "loud" is not debug, info, warn or error`, inv.Problems[0].String())
}

// The cluster name is a token of every flowd subject: what NATS or flowd's subjects would
// refuse is refused by config validate, with its key and line, rather than at start.
func TestClusterMustBeANATSSubjectToken(t *testing.T) {
	for name, msg := range map[string]string{
		`$x`:       `"$x" is not a valid NATS subject token: starts with '$' (reserved for NATS's own subjects)`,
		`eu.west`:  `"eu.west" is not a valid NATS subject token: contains '.'`,
		`"a b"`:    `"a b" is not a valid NATS subject token: contains white space`,
		`"a>"`:     `"a>" is not a valid NATS subject token: contains '>'`,
		`'*'`:      `"*" is not a valid NATS subject token: contains '*'`,
		`""`:       `"" is not a valid NATS subject token: empty`,
		`"a\fb"`:   `"a\fb" is not a valid NATS subject token: contains white space`,
		`"tab\tx"`: `"tab\tx" is not a valid NATS subject token: contains white space`,
	} {
		path := filepath.Join(t.TempDir(), "flowd.yaml")
		require.NoError(t, os.WriteFile(path, []byte("data_dir: d\ncluster: "+name+"\n"), 0o600))
		_, err := config.Load(path, nil)
		require.ErrorIs(t, err, config.ErrInvalid, name)
		var inv *config.InvalidError
		require.ErrorAs(t, err, &inv)
		require.Len(t, inv.Problems, 1, name)
		assert.Equal(t, config.Problem{Line: 2, Key: "cluster", Msg: msg}, inv.Problems[0], name)
	}
	c := config.Default()
	c.Cluster = "eu-west_1"
	assert.NoError(t, c.Validate())
}
