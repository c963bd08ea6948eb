package console

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/producer"
)

// browser starts headless Chromium for the test, or skips it when none is installed
// (.ci/run installs Debian's chromium).
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Skip("no Chromium found (chromium, chromium-browser or google-chrome on PATH): the browser tests need one; .ci/run installs it")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Headless, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, tcancel := context.WithTimeout(ctx, 60*time.Second)
	t.Cleanup(func() { tcancel(); cancel(); acancel() })
	_, err := chromedp.Run(ctx, chromedp.Evaluate[int](`1`)) // starts the browser
	require.NoError(t, err)
	return ctx
}

// screenshot saves the page as <FLOWD_SCREENSHOTS>/<name>.png when that variable names a
// directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("FLOWD_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
}

func TestBrowserOverviewAndLiveTopics(t *testing.T) {
	ctx := browser(t)
	e := start(t, nil)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/overview"),
		chromedp.WaitVisible(`main[data-view=overview] svg.chart`),
	))
	text, err := chromedp.Run(ctx, chromedp.Text(`main`))
	require.NoError(t, err)
	assert.Contains(t, text, "broker-a")
	assert.Contains(t, text, "Messages per second")
	assert.Contains(t, text, "Uptime")
	assert.NotContains(t, text, "[object", "an element rendered as text")
	screenshot(t, ctx, "console-overview")

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/topics"),
		chromedp.WaitVisible(`#create-topic`),
	))
	// A topic created over NATS (as flowd topic create does) appears without a reload.
	code, body := e.nats("topic.create", `{"topic":"from-cli","queues":3}`)
	require.Equal(t, 200, code, body)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`a[href="#/topics/from-cli"]`)))
	// And one created from the page reaches the broker.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(`#create-topic input[name=topic]`, "from-page"),
		chromedp.Click(`#create-topic button`),
		chromedp.WaitVisible(`a[href="#/topics/from-page"]`),
	))
	_, ok := e.b.Topic("from-page")
	assert.True(t, ok)
	screenshot(t, ctx, "console-topics")
}

func TestBrowserResetOffsetsMovesTheGroup(t *testing.T) {
	ctx := browser(t)
	e := start(t, nil)
	code, body := e.nats("topic.create", `{"topic":"orders","queues":1}`)
	require.Equal(t, 200, code, body)
	p, err := producer.New("console-test", producer.WithClientOptions(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	for i := range 5 {
		_, err := p.Send(context.Background(), &producer.Message{Topic: "orders", Body: fmt.Appendf(nil, "m-%d", i)})
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return e.b.StoreMax("orders", 0) == 5 }, wait, time.Millisecond)
	code, body = e.nats("group.reset_offset", `{"group":"billing","topic":"orders","to":"earliest"}`)
	require.Equal(t, 200, code, body)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/groups"),
		chromedp.WaitVisible(`a[href="#/groups/billing"]`),
		chromedp.Click(`a[href="#/groups/billing"]`),
		chromedp.WaitVisible(`#reset`),
		// The lag chart shows the group's lag: five messages not consumed.
		chromedp.WaitVisible(`svg.chart[data-last="5"]`),
		chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
			_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`))
			return err
		}),
		chromedp.SetValue(`#reset select[name=to]`, "latest"),
		chromedp.Click(`#reset button`),
		// The page polls: the chart falls to 0 without a reload.
		chromedp.WaitVisible(`svg.chart[data-last="0"]`),
	))
	code, body = e.nats("group.describe", `{"group":"billing"}`)
	require.Equal(t, 200, code, body)
	assert.Contains(t, body, `"committed":5`, "the page's reset moved the group to latest")
	screenshot(t, ctx, "console-group")
}

func TestBrowserReadRoleSeesNoChangeButtons(t *testing.T) {
	ctx := browser(t)
	e := start(t, func(c *Config) {
		c.Users = []User{{Name: "viewer", Password: "pw-read", Role: control.RoleRead}}
	})
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/topics"),
		chromedp.WaitVisible(`form.signin`),
		chromedp.SendKeys(`form.signin input[name=user]`, "viewer"),
		chromedp.SendKeys(`form.signin input[name=password]`, "pw-read"),
		chromedp.Click(`form.signin button`),
		chromedp.WaitVisible(`main[data-view=topics] table`),
	))
	text, err := chromedp.Run(ctx, chromedp.Text(`nav .who`))
	require.NoError(t, err)
	assert.Equal(t, "viewer · read", text)
	forms, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#create-topic').length`))
	require.NoError(t, err)
	assert.Zero(t, forms, "a read user sees the create form")
	// An admin call from the read user's page is refused.
	status, err := chromedp.Run(ctx, chromedp.Evaluate[int](`fetch('/api/v1/topic/create', {method:'POST', headers:{'Content-Type':'application/json'}, body:'{"topic":"nope","queues":1}'}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	assert.Equal(t, 403, status)
	_, ok := e.b.Topic("nope")
	assert.False(t, ok)
	screenshot(t, ctx, "console-read-role")
}

// The lag chart follows a real consumer: it shows the backlog after a produce and falls to
// 0 once a lite-pull group has read and committed it, with no reload and no event saying so.
func TestBrowserLagFallsToZeroWhenConsumed(t *testing.T) {
	ctx := browser(t)
	e := start(t, nil)
	code, body := e.nats("topic.create", `{"topic":"audit","queues":1}`)
	require.Equal(t, 200, code, body)
	p, err := producer.New("console-lag", producer.WithClientOptions(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() { p.Close(context.Background()) })
	for i := range 3 {
		_, err := p.Send(context.Background(), &producer.Message{Topic: "audit", Body: fmt.Appendf(nil, "a-%d", i)})
		require.NoError(t, err)
	}
	c, err := consumer.NewLitePull("auditors", consumer.WithClientOptions(client.WithNameServers(e.b.NamesrvAddr()), client.WithLogger(quiet())),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithAutoCommit(false))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe("audit", "*"))
	t.Cleanup(func() { c.Close(context.Background()) })
	// The group exists at the broker with nothing committed: lag 3.
	code, body = e.nats("group.reset_offset", `{"group":"auditors","topic":"audit","to":"earliest"}`)
	require.Equal(t, 200, code, body)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/groups/auditors"),
		chromedp.WaitVisible(`svg.chart[data-last="3"]`),
	))
	require.NoError(t, c.Start(context.Background()))
	got := 0
	deadline := time.Now().Add(wait)
	for got < 3 && time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		msgs, _ := c.Poll(pctx)
		cancel()
		got += len(msgs)
	}
	require.Equal(t, 3, got)
	require.NoError(t, c.Commit(context.Background()))
	// The page polls: the chart falls to 0 as the commit lands.
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`svg.chart[data-last="0"]`)))
}
