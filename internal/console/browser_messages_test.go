package console

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/runtime"
)

// withRegistry gives the command service a plugin registry of its own.
func withRegistry(t *testing.T) func(*broker.Broker, *control.ServiceConfig) {
	t.Helper()
	ctx := context.Background()
	rt, err := runtime.New(ctx, runtime.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, rt.Close(ctx)) })
	st, err := plugins.NewDirStore(filepath.Join(t.TempDir(), "plugins"))
	require.NoError(t, err)
	reg, err := plugins.NewRegistry(ctx, rt, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, reg.Close(ctx)) })
	return func(_ *broker.Broker, c *control.ServiceConfig) { c.Plugins = reg }
}

// deployRegionFilter deploys and activates examples/wasm/c-propfilter as the filter
// "region", keeping the messages whose property region is eu.
func deployRegionFilter(t *testing.T, e *env) {
	t.Helper()
	wasm, err := os.ReadFile("../../examples/wasm/c-propfilter/propfilter.wasm")
	require.NoError(t, err)
	sum := sha256.Sum256(wasm)
	req, err := json.Marshal(map[string]any{"manifest": map[string]any{"name": "region", "kind": "filter", "version": "1.0.0", "abi": 1,
		"parameters": map[string]string{"property": "region", "value": "eu"}, "sha256": hex.EncodeToString(sum[:])},
		"module": base64.StdEncoding.EncodeToString(wasm), "activate": true})
	require.NoError(t, err)
	code, body := e.nats("plugin.deploy", string(req))
	require.Equal(t, 200, code, body)
}

// sendRegions stores n messages in queue 0 of topic over NATS: body m-<i>, region eu for
// even i, else us.
func sendRegions(t *testing.T, e *env, topic string, n int) {
	t.Helper()
	for i := range n {
		region := map[bool]string{true: "eu", false: "us"}[i%2 == 0]
		code, body := e.nats("message.send", fmt.Sprintf(`{"topic":%q,"queue":0,"body":"m-%d","properties":{"region":%q}}`, topic, i, region))
		require.Equal(t, 200, code, body)
	}
	require.Eventually(t, func() bool { return e.b.StoreMax(topic, 0) == int64(n) }, wait, 5*time.Millisecond)
}

// shownBodies is the bodies of the messages the results table shows.
func shownBodies(t *testing.T, ctx context.Context) []string {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#results tbody tr')).map((r) => r.cells[5].querySelector('pre').textContent)`))
	require.NoError(t, err)
	return out
}

func TestBrowserMessagesBrowsePages(t *testing.T) {
	ctx := browser(t)
	e := start(t, nil)
	code, body := e.nats("topic.create", `{"topic":"orders","queues":1}`)
	require.Equal(t, 200, code, body)
	sendRegions(t, e, "orders", 5)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/messages"),
		chromedp.WaitVisible(`#browse`),
		chromedp.SendKeys(`#browse-topic`, "orders"),
		chromedp.SendKeys(`#browse-queue`, "0"),
		chromedp.SendKeys(`#browse-max`, "2"),
	))
	click(t, ctx, `#browse button[type=submit]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`#browse-pager`)))
	assert.Equal(t, []string{"m-0", "m-1"}, shownBodies(t, ctx))
	screenshot(t, ctx, "console-messages-browse")
	click(t, ctx, `#browse-next`)
	require.Eventually(t, func() bool { b := shownBodies(t, ctx); return len(b) > 0 && b[0] == "m-2" }, wait, 20*time.Millisecond)
	assert.Equal(t, []string{"m-2", "m-3"}, shownBodies(t, ctx))
	click(t, ctx, `#browse-next`)
	require.Eventually(t, func() bool { b := shownBodies(t, ctx); return len(b) > 0 && b[0] == "m-4" }, wait, 20*time.Millisecond)
	assert.Equal(t, []string{"m-4"}, shownBodies(t, ctx))
	disabled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('browse-next').disabled`))
	require.NoError(t, err)
	assert.True(t, disabled, "no page after the last message")
}

func TestBrowserMessagesSearchWithAWasmFilter(t *testing.T) {
	ctx := browser(t)
	e := startWith(t, withRegistry(t), nil)
	deployRegionFilter(t, e)
	code, body := e.nats("topic.create", `{"topic":"orders","queues":1}`)
	require.Equal(t, 200, code, body)
	sendRegions(t, e, "orders", 9)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/messages"),
		chromedp.WaitVisible(`#search`),
		chromedp.SendKeys(`#search-topic`, "orders"),
		chromedp.SendKeys(`#search-filter`, "region"),
		chromedp.SendKeys(`#search-max`, "3"),
	))
	click(t, ctx, `#search button[type=submit]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`#search-pager`)))
	got := shownBodies(t, ctx)
	assert.Equal(t, []string{"m-0", "m-2", "m-4"}, got, "the first page of matches")
	screenshot(t, ctx, "console-messages-search")
	click(t, ctx, `#search-next`)
	require.Eventually(t, func() bool { b := shownBodies(t, ctx); return len(b) > 0 && b[0] == "m-6" }, wait, 20*time.Millisecond)
	got = append(got, shownBodies(t, ctx)...)
	assert.Equal(t, []string{"m-0", "m-2", "m-4", "m-6", "m-8"}, got, "exactly the messages the filter keeps, each once")

	// A test message sent from the page is stored.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(`#send-topic`, "orders"),
		chromedp.SendKeys(`#send-body`, "from the page"),
	))
	click(t, ctx, `#send button[type=submit]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`#sent`)))
	require.Eventually(t, func() bool { return e.b.StoreMax("orders", 0) == 10 }, wait, 5*time.Millisecond)
}

func TestBrowserPluginsShowCallsAndAFaultNotice(t *testing.T) {
	ctx := browser(t)
	e := startWith(t, withRegistry(t), nil)
	deployRegionFilter(t, e)
	code, body := e.nats("topic.create", `{"topic":"orders","queues":1}`)
	require.Equal(t, 200, code, body)
	sendRegions(t, e, "orders", 4)
	code, body = e.nats("message.search", `{"topic":"orders","filter":"region"}`)
	require.Equal(t, 200, code, body)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/plugins"),
		chromedp.WaitVisible(`[data-calls=region]`),
	))
	calls, err := chromedp.Run(ctx, chromedp.Text(`[data-calls=region]`))
	require.NoError(t, err)
	assert.NotEqual(t, "0", calls, "the search's calls are counted")
	faults, err := chromedp.Run(ctx, chromedp.Text(`[data-faults=region]`))
	require.NoError(t, err)
	assert.Equal(t, "0", faults)

	// A fault that stops the plugin (the daemon publishes it from the filter's fault hook)
	// shows as a notice while the page is open, on any view.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.srv.URL+"/#/topics"), chromedp.WaitVisible(`main[data-view=topics]`)))
	e.pub.Plugin(control.PluginEvent{Type: control.EventPluginFailed, Name: "region", Version: "1.0.0", Kind: "filter", Reason: "trap: unreachable"})
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`.notice[data-plugin=region]`)))
	text, err := chromedp.Run(ctx, chromedp.Text(`.notice[data-plugin=region]`))
	require.NoError(t, err)
	assert.Contains(t, text, "Plugin region 1.0.0 faulted")
	assert.Contains(t, text, "trap: unreachable")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(e.srv.URL+"/#/plugins"), chromedp.WaitVisible(`[data-calls=region]`)))
	screenshot(t, ctx, "console-plugins")
}
