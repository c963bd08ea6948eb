package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A bad configuration file makes both `flowd config validate` and `flowd serve --config`
// exit non-zero with a message naming what is wrong (the setting, its line, the value), and
// serve starts nothing. Each file but the listen one is baseConfig (five lines, so that a
// serve that wrongly started would bind only free ports) and the bad part from line 6.
func TestBadConfigurationFilesAreRefusedWithTheirFault(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown key", "store:\n  flsh: sync\n", []string{`line 7: store.flsh: unknown key; did you mean "flush"?`}},
		{"wrong type", "limits:\n  max_groups: many\n", []string{"line 7: limits.max_groups: cannot unmarshal !!str `many` into int"}},
		{"bad duration", "store:\n  retention: 3 days\n", []string{"line 7: store.retention: cannot unmarshal !!str `3 days` into time.Duration"}},
		{"bad size", "store:\n  segment_size: 12 parsecs\n", []string{`line 7: store.segment_size: size "12 parsecs": want a byte count`}},
		{"bad value", "log:\n  level: loud\n", []string{`log.level: "loud" is not debug, info, warn or error`}},
		{"bad pipeline field", "pipelines:\n  - {name: p, topics: [orders], sink: {type: topic}}\n", []string{`pipelines[0].sink.topic: "" is not a valid topic name`}},
		{"bad pipeline duration", "pipelines:\n  - {name: p, topics: [orders], retry_backoff: soon, sink: {type: stdout}}\n",
			[]string{`line 7: pipelines[0].retry_backoff: duration "soon"`}},
		{"bad pipeline source", "pipelines:\n  - {name: p, topics: [orders], source_name_servers: [nohost], sink: {type: stdout}}\n",
			[]string{`pipelines[0].source_name_servers[0]: "nohost" is not host:port`}},
		{"bad listen address", "", []string{`listen.broker: "127.0.0.1:99999" has no port in 0-65535`, `http.listen: "localhost" is not host:port, or "off"`}},
		{"not YAML", "pipelines: [\n", []string{"line 6: did not find expected node content"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, filepath.Base(t.Name())+".yaml")
			doc := baseConfig(dir) + c.yaml
			if c.name == "bad listen address" {
				doc = "data_dir: " + filepath.Join(dir, "data") + "\nlisten: {broker: \"127.0.0.1:99999\", namesrv: \"127.0.0.1:0\", grpc: \"127.0.0.1:0\"}\n" +
					"nats: {listen: \"127.0.0.1:0\"}\nhttp: {listen: localhost}\n"
			}
			require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
			refused(t, path, c.want...)
		})
	}
	t.Run("no such file", func(t *testing.T) {
		refused(t, filepath.Join(dir, "missing.yaml"), "config: open ", "missing.yaml: no such file or directory")
	})
	t.Run("a directory", func(t *testing.T) {
		refused(t, dir, "config: read "+dir+": is a directory")
	})
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads a file of mode 0")
		}
		path := filepath.Join(dir, "secret.yaml")
		require.NoError(t, os.WriteFile(path, []byte(baseConfig(dir)), 0))
		refused(t, path, "config: open "+path+": permission denied")
	})
	_, err := os.Stat(filepath.Join(dir, "data", "store"))
	assert.ErrorIs(t, err, os.ErrNotExist, "no serve got as far as opening the store")
}

// refused runs `flowd config validate path` and `flowd serve --config path` and requires
// both to fail with every one of want in their message.
func refused(t *testing.T, path string, want ...string) {
	t.Helper()
	for _, args := range [][]string{{"config", "validate", path}, {"serve", "--config", path}} {
		out, err := flowd(args...)
		require.Error(t, err, "flowd %v accepts it: %s", args, out)
		for _, w := range want {
			assert.Contains(t, err.Error(), w, "flowd %v", args)
		}
	}
}

// A listen address that is well formed but taken passes `config validate` (it is a fact of
// the machine, not of the file) and makes serve exit non-zero naming the listener, its
// setting and flag, before the daemon serves anything.
func TestServeRefusesATakenListenAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().String()
	for key, c := range map[string]struct{ in, want string }{
		"listen.broker":  {`broker: "127.0.0.1:0"`, "listen broker " + taken + ": address already in use (set listen.broker / --listen to another address)"},
		"listen.namesrv": {`namesrv: "127.0.0.1:0"`, "listen name service " + taken + ": address already in use (set listen.namesrv / --namesrv-listen to another address, or --namesrv-listen off to disable it)"},
		"nats.listen":    {`nats: {listen: "127.0.0.1:0"}`, "listen NATS " + taken + ": address already in use (set nats.listen / --nats-listen to another address, or --nats-listen off to disable it)"},
		"listen.grpc":    {`grpc: "127.0.0.1:0"`, "listen gRPC " + taken + ": address already in use (set listen.grpc / --grpc-listen to another address, or --grpc-listen off to disable it)"},
		"http.listen":    {`http: {listen: "127.0.0.1:0"}`, "listen HTTP " + taken + ": address already in use (set http.listen / --http-listen to another address, or --http-listen off to disable it)"},
	} {
		t.Run(key, func(t *testing.T) {
			dir := t.TempDir()
			doc := strings.Replace(baseConfig(dir), c.in, strings.Replace(c.in, "127.0.0.1:0", taken, 1), 1)
			require.NotEqual(t, baseConfig(dir), doc)
			path := filepath.Join(dir, "flowd.yaml")
			require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
			_, err := flowd("config", "validate", path)
			require.NoError(t, err)
			_, err = flowd("serve", "--config", path)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), "address already in use")
		})
	}
}
