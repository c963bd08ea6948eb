package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
)

func writeConfig(t *testing.T, doc string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	require.NoError(t, os.WriteFile(path, []byte(doc), 0o600))
	return path
}

// The cluster settings decode from the file and the environment; left out, there is no
// cluster.
func TestNATSClusterSettingsDecode(t *testing.T) {
	def := config.Default()
	assert.Equal(t, config.NATSCluster{Routes: []string{}}, def.NATS.Cluster)
	assert.Empty(t, def.NATS.ServerName)

	path := writeConfig(t, "nats:\n  server_name: n1\n  cluster:\n    name: east\n    listen: 10.0.0.1:6222\n"+
		"    routes: [nats-route://10.0.0.2:6222, nats-route://10.0.0.3:6222]\n    user: route\n    password: r-secret\n")
	cfg, err := config.Load(path, nil)
	require.NoError(t, err)
	assert.Equal(t, "n1", cfg.NATS.ServerName)
	assert.Equal(t, config.NATSCluster{Name: "east", Listen: "10.0.0.1:6222", User: "route", Password: "r-secret",
		Routes: []string{"nats-route://10.0.0.2:6222", "nats-route://10.0.0.3:6222"}}, cfg.NATS.Cluster)

	cfg, err = config.Load("", []string{"FLOWD_NATS_CLUSTER_LISTEN=127.0.0.1:6222", "FLOWD_NATS_ROUTES=nats-route://127.0.0.1:6223, nats-route://127.0.0.1:6224"})
	require.NoError(t, err)
	assert.Equal(t, []string{"nats-route://127.0.0.1:6223", "nats-route://127.0.0.1:6224"}, cfg.NATS.Cluster.Routes)
}

// Each cluster setting that cannot work is named, with its line, before anything starts.
func TestNATSClusterSettingsAreValidated(t *testing.T) {
	doc := "broker_name: broker.a\n" + // line 1
		"nats:\n" +
		"  server_name: '*'\n" + // line 3
		"  cluster:\n" +
		"    name: a.b\n" + // line 5
		"    listen: 0.0.0.0:6222\n" + // line 6
		"    password: r-secret\n" + // line 7
		"    routes:\n" +
		"      - http://10.0.0.2:6222\n" + // line 9
		"      - nats-route://10.0.0.3\n" + // line 10
		"      - nats-route://10.0.0.4:6222/x\n" // line 11
	_, err := config.Load(writeConfig(t, doc), nil)
	require.ErrorIs(t, err, config.ErrInvalid)
	msg := err.Error()
	for _, want := range []string{
		`line 3: nats.server_name: "*" is not a valid NATS subject token`,
		`line 5: nats.cluster.name: "a.b" is not a valid NATS subject token`,
		`line 6: nats.cluster.listen: "0.0.0.0:6222" is not a loopback address: set nats.cluster.user and nats.cluster.password`,
		`line 4: nats.cluster.user: must be set with nats.cluster.password`,
		`line 9: nats.cluster.routes[0]: "http://10.0.0.2:6222" is not a route URL`,
		`line 10: nats.cluster.routes[1]: "nats-route://10.0.0.3" is not nats-route://host:port`,
		`line 11: nats.cluster.routes[2]: "nats-route://10.0.0.4:6222/x" has something after host:port`,
	} {
		assert.Contains(t, msg, want)
	}
	assert.NotContains(t, msg, "broker_name", "server_name is set: the broker name does not name the server")

	bad := func(mod func(*config.Config), want string) {
		t.Helper()
		c := config.Default()
		mod(&c)
		err := c.Validate()
		require.ErrorIs(t, err, config.ErrInvalid, want)
		assert.Contains(t, err.Error(), want)
	}
	bad(func(c *config.Config) { c.NATS.Cluster.Routes = []string{"nats-route://n2:6222"} }, "nats.cluster.routes: routes need a route listener")
	bad(func(c *config.Config) { c.NATS.Cluster.User = "route" }, "nats.cluster.password: must be set with nats.cluster.user")
	bad(func(c *config.Config) { c.NATS.Cluster.Listen = c.NATS.Listen }, `nats.cluster.listen: "127.0.0.1:4222" is the address of nats.listen too`)
	bad(func(c *config.Config) { c.NATS.Cluster.Listen = "127.0.0.1:0" }, "nats.cluster.listen: port 0 needs nats.cluster.routes")
	bad(func(c *config.Config) { c.NATS.Cluster.Listen = "127.0.0.1:x" }, `nats.cluster.listen: "127.0.0.1:x" has no port`)
	bad(func(c *config.Config) { c.NATS.Cluster.Listen, c.NATS.Listen = "127.0.0.1:6222", "off" }, `nats.cluster.listen: needs the client listener`)
	bad(func(c *config.Config) { c.NATS.Cluster.Listen, c.BrokerName = "127.0.0.1:6222", "broker a" }, `broker_name: "broker a" is not a valid NATS subject token`)
	bad(func(c *config.Config) {
		c.NATS.Cluster.Listen, c.NATS.URLs = "127.0.0.1:6222", []string{"nats://n1:4222"}
	}, "nats.cluster.listen: applies to the embedded server, which nats.urls replaces")

	// Alone, a broker name that is no NATS token names nothing in NATS: it is not refused.
	c := config.Default()
	c.BrokerName = "broker a"
	require.NoError(t, c.Validate())
	c.NATS.Cluster.Listen = "127.0.0.1:6222"
	c.BrokerName = "broker-a"
	require.NoError(t, c.Validate(), "a seed on loopback")
}
