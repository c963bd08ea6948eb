package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// wait bounds what happens at once on a healthy machine. It is only a deadline for
// conditions: compiling a Go guest under the race detector on a loaded machine has taken
// over 40 s, so it is generous.
const wait = 90 * time.Second

// wasmSelector subscribes through a deployed Wasm filter: the expression names it.
type wasmSelector string

func (wasmSelector) Type() string         { return "WASM" }
func (s wasmSelector) Expression() string { return string(s) }

// daemon is a flowd serve running in the test, on free loopback ports.
type daemon struct {
	t         *testing.T
	broker    string
	namesrv   string
	pluginDir string
	nc        *nats.Conn
	logs      *syncBuffer
	stop      func()
}

func startDaemon(t *testing.T) *daemon { return startDaemonIn(t, t.TempDir()) }

// startDaemonIn runs flowd with its data and plugin directories under dir.
func startDaemonIn(t *testing.T, dir string) *daemon {
	t.Helper()
	d := &daemon{t: t, pluginDir: filepath.Join(dir, "drop"), logs: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--data-dir", filepath.Join(dir, "data"), "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--grpc-listen", "off", "--namesrv-listen", "127.0.0.1:0",
			"--nats-listen", "127.0.0.1:0", "--plugin-dir", d.pluginDir, "--plugin-poll", "50ms"}, d.logs, d.logs)
	}()
	d.stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(wait):
			t.Error("flowd did not stop")
		}
	})
	t.Cleanup(d.stop)
	re := regexp.MustCompile(`broker=(127\.0\.0\.1:\d+) namesrv=(127\.0\.0\.1:\d+) nats=(nats://127\.0\.0\.1:\d+)`)
	var m []string
	require.Eventually(t, func() bool {
		m = re.FindStringSubmatch(d.logs.String())
		return m != nil
	}, wait, 10*time.Millisecond, "flowd logs its addresses: %s", d.logs.String())
	d.broker, d.namesrv = m[1], m[2]
	nc, err := nats.Connect(m[3])
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	d.nc = nc
	return d
}

// request sends a command and returns the reply and its error code ("" for success).
func (d *daemon) request(cmd string, body any) (*nats.Msg, string) {
	d.t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(d.t, err)
	msg, err := d.nc.Request("flowd.ctl.v1.local."+cmd, raw, wait)
	require.NoError(d.t, err, cmd)
	return msg, msg.Header.Get("Nats-Service-Error-Code")
}

func (d *daemon) ok(cmd string, body any, out any) {
	d.t.Helper()
	msg, code := d.request(cmd, body)
	require.Empty(d.t, code, "%s: %s", cmd, msg.Data)
	if out != nil {
		require.NoError(d.t, json.Unmarshal(msg.Data, out))
	}
}

// active is the active version of a plugin, from plugin.list.
func (d *daemon) active(name string) string {
	d.t.Helper()
	var list control.PluginListReply
	d.ok("plugin.list", map[string]string{"name": name}, &list)
	for _, p := range list.Plugins {
		if p.Active {
			return p.Manifest.Version
		}
	}
	return ""
}

// drop writes a plugin into the watched directory: the manifest first, then the module,
// each through a rename, so the daemon never sees half a file.
func (d *daemon) drop(file string, manifest map[string]any, wasm []byte) {
	d.t.Helper()
	raw, err := json.Marshal(manifest)
	require.NoError(d.t, err)
	for _, f := range []struct {
		name string
		data []byte
	}{{file + ".json", raw}, {file + ".wasm", wasm}} {
		tmp := filepath.Join(d.pluginDir, "."+f.name+".tmp")
		require.NoError(d.t, os.WriteFile(tmp, f.data, 0o644))
		require.NoError(d.t, os.Rename(tmp, filepath.Join(d.pluginDir, f.name)))
	}
}

func (d *daemon) producer() *producer.Producer {
	d.t.Helper()
	p, err := producer.New("wasm-test-producers", producer.WithClientOptions(client.WithNameServers(d.namesrv), client.WithLogger(quietLog()), client.WithInstanceName(d.t.Name())))
	require.NoError(d.t, err)
	require.NoError(d.t, p.Start(context.Background()))
	d.t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func (d *daemon) consumer(group, topic string, sel consumer.Selector) *consumer.LitePull {
	d.t.Helper()
	c, err := consumer.NewLitePull(group, consumer.WithClientOptions(client.WithNameServers(d.namesrv), client.WithLogger(quietLog()), client.WithInstanceName(d.t.Name()+"-"+group)), consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithPollTimeout(100*time.Millisecond), consumer.WithPullDelays(10*time.Millisecond, 10*time.Millisecond, 20*time.Millisecond))
	require.NoError(d.t, err)
	require.NoError(d.t, c.SubscribeSelector(topic, sel))
	require.NoError(d.t, c.Start(context.Background()))
	d.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// pollUntil polls c, handing every message to seen, until done says so or wait passes.
func pollUntil(t *testing.T, c *consumer.LitePull, seen func(*consumer.Message), done func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !done() {
		require.True(t, time.Now().Before(deadline), "timed out polling")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		msgs, err := c.Poll(ctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			require.NoError(t, err)
		}
		for _, m := range msgs {
			seen(m)
		}
	}
}

func sendRegions(t *testing.T, p *producer.Producer, topic, prefix string, n int) {
	t.Helper()
	for i := range n {
		region := []string{"eu", "us"}[i%2]
		_, err := p.Send(context.Background(), &producer.Message{Topic: topic, Tags: "order",
			Body: fmt.Appendf(nil, "%s-%s-%d", region, prefix, i), Properties: map[string]string{"region": region}})
		require.NoError(t, err)
	}
}

func propfilter(t *testing.T) []byte {
	t.Helper()
	wasm, err := os.ReadFile("../../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	return wasm
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// A filter dropped into --plugin-dir is deployed and activated; a consumer subscribing with
// expression type WASM gets only what it keeps; a new version deployed and activated over
// NATS takes over the running subscription; bad deploys answer 400 naming the field.
func TestServeDeploysWasmFiltersAndSwapsThemWithoutRestart(t *testing.T) {
	d := startDaemon(t)
	events, err := d.nc.SubscribeSync("flowd.evt.local.plugin.>")
	require.NoError(t, err)
	require.NoError(t, d.nc.Flush())
	d.ok("topic.create", map[string]any{"topic": "orders", "queues": 2}, nil)

	wasm := propfilter(t)
	d.drop("region", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}}, wasm)
	require.Eventually(t, func() bool { return d.active("region") == "1.0.0" }, wait, 20*time.Millisecond, "logs: %s", d.logs.String())
	for _, want := range []string{"flowd.evt.local.plugin.deployed", "flowd.evt.local.plugin.activated"} {
		msg, err := events.NextMsg(wait)
		require.NoError(t, err)
		assert.Equal(t, want, msg.Subject)
		assert.Equal(t, "region", msg.Header.Get("ce-subject"))
		assert.Contains(t, string(msg.Data), `"pluginVersion":"1.0.0"`)
	}

	p := d.producer()
	sendRegions(t, p, "orders", "a", 10)
	c := d.consumer("eu-readers", "orders", wasmSelector("region"))
	got := map[string]bool{}
	record := func(m *consumer.Message) {
		got[string(m.Body)] = true
	}
	pollUntil(t, c, record, func() bool { return len(got) >= 5 })
	for body := range got {
		assert.True(t, strings.HasPrefix(body, "eu-a-"), "version 1.0.0 keeps region=eu only, got %s", body)
	}

	// Version 2.0.0 keeps region=us: deployed and activated over NATS, it takes over the
	// subscription that names just "region", while the consumer keeps polling.
	man := map[string]any{"name": "region", "kind": "filter", "version": "2.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "us"}, "sha256": sha(wasm)}
	d.ok("plugin.deploy", map[string]any{"manifest": man, "module": base64.StdEncoding.EncodeToString(wasm)}, nil)
	assert.Equal(t, "1.0.0", d.active("region"), "deploying does not activate")
	d.ok("plugin.activate", map[string]string{"name": "region", "version": "2.0.0"}, nil)
	for _, want := range []string{"flowd.evt.local.plugin.deployed", "flowd.evt.local.plugin.activated"} {
		msg, err := events.NextMsg(wait)
		require.NoError(t, err)
		assert.Equal(t, want, msg.Subject)
		assert.Contains(t, string(msg.Data), `"pluginVersion":"2.0.0"`)
	}
	sendRegions(t, p, "orders", "b", 10)
	clear(got)
	us := 0
	pollUntil(t, c, func(m *consumer.Message) {
		body := string(m.Body)
		assert.False(t, strings.HasPrefix(body, "eu-"), "version 2.0.0 keeps region=us only, got %s", body)
		if strings.HasPrefix(body, "us-b-") && !got[body] {
			us++
		}
		got[body] = true
	}, func() bool { return us == 5 })

	var list control.PluginListReply
	d.ok("plugin.list", nil, &list)
	require.Len(t, list.Plugins, 2)
	assert.Equal(t, "1.0.0", list.Plugins[0].Manifest.Version)
	assert.False(t, list.Plugins[0].Active)
	assert.Equal(t, "2.0.0", list.Plugins[1].Manifest.Version)
	assert.True(t, list.Plugins[1].Active)

	// Bad input is refused, naming the field.
	bad := func(body any, field string) {
		t.Helper()
		msg, code := d.request("plugin.deploy", body)
		assert.Equal(t, "400", code, string(msg.Data))
		assert.Contains(t, msg.Header.Get("Nats-Service-Error"), fmt.Sprintf("field %q", field))
	}
	module := base64.StdEncoding.EncodeToString(wasm)
	withVersion := func(v string) map[string]any {
		m := map[string]any{}
		for k, x := range man {
			m[k] = x
		}
		m["version"] = v
		return m
	}
	bad(map[string]any{"manifest": withVersion("three"), "module": module}, "manifest.version")
	bad(map[string]any{"manifest": withVersion("3.0.0"), "module": "not base64!"}, "module")
	bad(map[string]any{"manifest": withVersion("3.0.0"), "module": base64.StdEncoding.EncodeToString(append([]byte{}, wasm[:len(wasm)-1]...))}, "module")
	bad(map[string]any{"module": module}, "manifest")
	// The subscription keeps working after refused deploys.
	assert.Equal(t, "2.0.0", d.active("region"))

	// Subscriptions the WASM compiler refuses are answered SUBSCRIPTION_PARSE_FAILED, naming
	// what is wrong.
	cl := remoting.NewClient(remoting.ClientOptions{})
	defer cl.Close()
	for expr, want := range map[string]string{
		"nosuch":           `"nosuch"`,
		"region?value=us":  "per-subscription parameters are not supported",
		"region@1.0.0":     "region@1.0.0 is not active",
		"region@2.0.0?x=1": "per-subscription parameters",
	} {
		resp, err := cl.Invoke(context.Background(), d.broker, protocol.NewRequestWith(protocol.PullMessage, &protocol.PullMessageRequestHeader{
			ConsumerGroup: "raw", Topic: "orders", MaxMsgNums: 8, SysFlag: protocol.PullFlagSubscription,
			Subscription: expr, ExpressionType: "WASM"}, nil))
		require.NoError(t, err)
		assert.Equal(t, protocol.SubscriptionParseFailed, resp.ResponseCode(), expr)
		assert.Contains(t, resp.Remark, want, expr)
	}

	// A module too large for a request goes through the object store bucket FLOWD_PLUGINS.
	bad(map[string]any{"manifest": withVersion("3.0.0"), "object": "region-3"}, "object") // no bucket yet
	js, err := jetstream.New(d.nc)
	require.NoError(t, err)
	bucket, err := js.CreateObjectStore(context.Background(), jetstream.ObjectStoreConfig{Bucket: control.PluginBucket})
	require.NoError(t, err)
	_, err = bucket.PutBytes(context.Background(), "region-3", wasm)
	require.NoError(t, err)
	bad(map[string]any{"manifest": withVersion("3.0.0"), "object": "nosuch"}, "object")
	bad(map[string]any{"manifest": withVersion("3.0.0"), "object": "region-3", "module": module}, "object")
	var dep control.PluginReply
	d.ok("plugin.deploy", map[string]any{"manifest": withVersion("3.0.0"), "object": "region-3", "activate": true}, &dep)
	assert.True(t, dep.Plugin.Active)
	assert.Equal(t, "3.0.0", d.active("region"))

	// A changed file in the plugin directory deploys the manifest's new version; a broken
	// one is logged with its name and changes nothing.
	d.drop("broken", map[string]any{"name": "broken", "kind": "filter", "version": "1.0.0", "abi": 1}, wasm)
	require.Eventually(t, func() bool {
		return strings.Contains(d.logs.String(), "plugin file not deployed") && strings.Contains(d.logs.String(), "broken.wasm")
	}, wait, 20*time.Millisecond, "flowd_init refuses a filter without parameters: %s", d.logs.String())
	d.drop("region", map[string]any{"name": "region", "kind": "filter", "version": "4.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}}, wasm)
	require.Eventually(t, func() bool { return d.active("region") == "4.0.0" }, wait, 20*time.Millisecond, "logs: %s", d.logs.String())
	var all control.PluginListReply
	d.ok("plugin.list", nil, &all)
	for _, p := range all.Plugins {
		assert.Equal(t, "region", p.Manifest.Name, "nothing of the broken pair was stored")
	}
}

// badguest builds plugins/testdata/badguest, a filter that traps on a batch mentioning
// "boom" when its mode is "trap".
func badguest(t *testing.T) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "badguest.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "../../plugins/testdata/badguest")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	o, err := cmd.CombinedOutput()
	require.NoError(t, err, string(o))
	wasm, err := os.ReadFile(out)
	require.NoError(t, err)
	return wasm
}

// A filter that traps under fail_closed stops its own subscriptions, reports plugin.failed,
// and holds up nobody else: another group on the same topic, through another filter, gets
// every message.
func TestServeTrappingFilterFailsClosedAlone(t *testing.T) {
	guest := badguest(t)
	d := startDaemon(t)
	events, err := d.nc.SubscribeSync("flowd.evt.local.plugin.failed")
	require.NoError(t, err)
	require.NoError(t, d.nc.Flush())
	d.ok("topic.create", map[string]any{"topic": "mixed", "queues": 2}, nil)
	d.drop("trapper", map[string]any{"name": "trapper", "kind": "filter", "version": "1.0.0", "abi": 1,
		"limits": map[string]any{"memory_pages": 128, "max_instances": 1},
		"policy": map[string]any{"on_fault": "fail_closed"}, "parameters": map[string]string{"mode": "trap"}}, guest)
	d.drop("region", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}}, propfilter(t))
	require.Eventually(t, func() bool { return d.active("trapper") == "1.0.0" && d.active("region") == "1.0.0" },
		wait, 20*time.Millisecond, "logs: %s", d.logs.String())

	p := d.producer()
	trapped := d.consumer("trapped", "mixed", wasmSelector("trapper"))
	healthy := d.consumer("healthy", "mixed", wasmSelector("region"))
	// The trapping filter keeps everything until it sees "boom".
	sendRegions(t, p, "mixed", "a", 4)
	n := 0
	pollUntil(t, trapped, func(*consumer.Message) { n++ }, func() bool { return n == 4 })

	_, err = p.Send(context.Background(), &producer.Message{Topic: "mixed", Tags: "boom", Body: []byte("eu-boom"), Properties: map[string]string{"region": "eu"}})
	require.NoError(t, err)
	// Polling makes the trapped group pull the "boom" message, which trips the policy.
	var msg *nats.Msg
	pollUntil(t, trapped, func(m *consumer.Message) {
		assert.NotEqual(t, "eu-boom", string(m.Body), "a fail-closed filter delivers nothing it failed on")
	}, func() bool {
		msg, err = events.NextMsg(10 * time.Millisecond)
		return err == nil
	})
	assert.Equal(t, "trapper", msg.Header.Get("ce-subject"))
	assert.Contains(t, string(msg.Data), "trap")

	sendRegions(t, p, "mixed", "b", 4)
	eu := map[string]bool{}
	pollUntil(t, healthy, func(m *consumer.Message) { eu[string(m.Body)] = true }, func() bool { return len(eu) == 5 })
	assert.Equal(t, map[string]bool{"eu-a-0": true, "eu-a-2": true, "eu-boom": true, "eu-b-0": true, "eu-b-2": true}, eu)
}

// After a restart the plugin directory's files, deployed already, do not re-activate their
// version over one activated since over NATS.
func TestServeRestartKeepsTheActiveVersion(t *testing.T) {
	dir := t.TempDir()
	d := startDaemonIn(t, dir)
	wasm := propfilter(t)
	d.drop("region", map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}}, wasm)
	require.Eventually(t, func() bool { return d.active("region") == "1.0.0" }, wait, 20*time.Millisecond, "logs: %s", d.logs.String())
	man := map[string]any{"name": "region", "kind": "filter", "version": "2.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "us"}, "sha256": sha(wasm)}
	d.ok("plugin.deploy", map[string]any{"manifest": man, "module": base64.StdEncoding.EncodeToString(wasm), "activate": true}, nil)
	d.stop()

	d = startDaemonIn(t, dir)
	assert.Equal(t, "2.0.0", d.active("region"), "the registry keeps the active version")
	// The directory is scanned in name order: once zz-last is active, region.* was seen.
	d.drop("zz-last", map[string]any{"name": "zz-last", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}}, wasm)
	require.Eventually(t, func() bool { return d.active("zz-last") == "1.0.0" }, wait, 20*time.Millisecond, "logs: %s", d.logs.String())
	assert.Equal(t, "2.0.0", d.active("region"))
}

// In a cluster plugin list prints each version's per-node reports; alone, no NODES column.
func TestPrintPluginsShowsEachNode(t *testing.T) {
	m1 := &plugins.Manifest{Name: "region", Kind: plugins.KindFilter, Version: "1.0.0"}
	m2 := &plugins.Manifest{Name: "region", Kind: plugins.KindFilter, Version: "2.0.0"}
	var alone bytes.Buffer
	printPlugins(&alone, control.PluginView{Manifest: m1, Active: true})
	assert.Equal(t, "NAME\tVERSION\tKIND\tACTIVE\nregion\t1.0.0\tfilter\ttrue\n", alone.String())

	var out bytes.Buffer
	printPlugins(&out,
		control.PluginView{Manifest: m1},
		control.PluginView{Manifest: m2, Active: true, Nodes: []control.PluginNode{
			{Node: "broker-1", Active: true}, {Node: "broker-2", Error: "sha256 mismatch"},
		}})
	assert.Equal(t, "NAME\tVERSION\tKIND\tACTIVE\tNODES\n"+
		"region\t1.0.0\tfilter\tfalse\t-\n"+
		"region\t2.0.0\tfilter\ttrue\tbroker-1=active,broker-2=refused\n", out.String())
}
