package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
)

// config validate names every cluster setting that cannot work, with its line.
func TestConfigValidateNamesTheNATSClusterSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	doc := "nats:\n  cluster:\n    name: a.b\n    listen: 0.0.0.0:6222\n    routes: [nats-route://n2]\n"
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	var out syncBuffer
	err := run(context.Background(), []string{"config", "validate", path}, &out, &out)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Contains(t, err.Error(), `line 3: nats.cluster.name: "a.b" is not a valid NATS subject token`)
	assert.Contains(t, err.Error(), `line 4: nats.cluster.listen: "0.0.0.0:6222" is not a loopback address`)
	assert.Contains(t, err.Error(), `line 5: nats.cluster.routes[0]: "nats-route://n2" is not nats-route://host:port`)
}

// serve refuses bad cluster flags before anything starts, naming the setting and its flag.
func TestServeNamesTheNATSClusterFlags(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"open route listener": {[]string{"--nats-cluster-listen", "0.0.0.0:6222"}, `nats.cluster.listen (--nats-cluster-listen): "0.0.0.0:6222" is not a loopback address`},
		"bad route":           {[]string{"--nats-cluster-listen", "127.0.0.1:6222", "--nats-routes", "nats-route://127.0.0.1:6223,http://x:1"}, `nats.cluster.routes[1] (--nats-routes): "http://x:1" is not a route URL`},
		"routes alone":        {[]string{"--nats-routes", "nats-route://127.0.0.1:6223"}, "nats.cluster.routes (--nats-routes): routes need a route listener"},
		"cluster name":        {[]string{"--nats-cluster-listen", "127.0.0.1:6222", "--nats-cluster-name", "$east"}, `nats.cluster.name (--nats-cluster-name): "$east" is not a valid NATS subject token`},
		"server name":         {[]string{"--nats-server-name", "a b"}, `nats.server_name (--nats-server-name): "a b" is not a valid NATS subject token`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var logs syncBuffer
			err := run(ctx, append([]string{"serve", "--data-dir", t.TempDir(), "--grpc-listen", "off"}, c.args...), &logs, &logs)
			require.ErrorIs(t, err, config.ErrInvalid)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, logs.String(), "flowd serving")
		})
	}
}

// The NATS cluster is named after flowd's cluster and the server after the broker, unless
// set; without a route listener nothing changes (the server keeps its standalone name).
func TestNATSClusterSettingsMapOntoTheControlPlane(t *testing.T) {
	c := config.Default()
	name, cl := natsCluster(c)
	assert.Empty(t, name)
	assert.Empty(t, cl.Listen)

	c.NATS.Cluster = config.NATSCluster{Listen: "127.0.0.1:6222", Routes: []string{"nats-route://127.0.0.1:6223"}, User: "u", Password: "p"}
	name, cl = natsCluster(c)
	assert.Equal(t, "broker-a", name)
	assert.Equal(t, control.NATSClusterConfig{Name: "local", Listen: "127.0.0.1:6222", Routes: []string{"nats-route://127.0.0.1:6223"}, User: "u", Password: "p"}, cl)

	c.NATS.ServerName, c.NATS.Cluster.Name = "n1", "east"
	name, cl = natsCluster(c)
	assert.Equal(t, "n1", name)
	assert.Equal(t, "east", cl.Name)
}
