package console

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// withPipelines gives the command service a pipeline manager reading from the test's
// broker, as flowd serve's does, and hands it to the test through m.
func withPipelines(t *testing.T, m **pipeline.Manager) func(*broker.Broker, *control.ServiceConfig) {
	t.Helper()
	return func(b *broker.Broker, c *control.ServiceConfig) {
		mgr, err := pipeline.NewManager(pipeline.Options{
			NameServers: []string{b.NamesrvAddr()}, Logger: quiet(), Stdout: io.Discard,
			ConsumerOptions: []consumer.Option{
				consumer.WithPollTimeout(200 * time.Millisecond),
				consumer.WithLockRetryInterval(50 * time.Millisecond),
				consumer.WithClientOptions(client.WithHeartbeatInterval(time.Second)),
			},
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			assert.NoError(t, mgr.Close(ctx))
		})
		*m = mgr
		c.Pipelines = mgr
	}
}

// click clicks the element sel names in one step of the page's own: the page redraws on
// every event, so a node found by one protocol call may be gone by the next.
func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	require.Eventually(t, func() bool {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const el = document.querySelector(`+"`"+sel+"`"+`); if (!el || el.disabled) return false; el.click(); return true; })()`))
		return err == nil && ok
	}, wait, 20*time.Millisecond, "no %s to click", sel)
}

func TestBrowserPausingAPipelinePausesIt(t *testing.T) {
	ctx := browser(t)
	var m *pipeline.Manager
	e := startWith(t, withPipelines(t, &m), nil)
	code, body := e.nats("topic.create", `{"topic":"orders","queues":1}`)
	require.Equal(t, 200, code, body)
	bg := context.Background()
	require.NoError(t, m.Start(bg, pipeline.Definition{
		Name: "audit", Topics: []string{"orders"}, StartFrom: pipeline.StartFirst,
		Sink: pipeline.SinkDefinition{Type: pipeline.SinkStdout},
	}))
	require.Eventually(t, func() bool {
		st, err := m.Get(bg, "audit")
		return err == nil && st.State == pipeline.StateRunning
	}, wait, 10*time.Millisecond)

	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/pipelines"),
		chromedp.WaitVisible(`[data-state=running]`),
	))
	click(t, ctx, `button[data-action=pause]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`[data-state=paused]`)))
	st, err := m.Get(bg, "audit")
	require.NoError(t, err)
	assert.Equal(t, pipeline.StatePaused, st.State, "the page's pause reached the manager")
	screenshot(t, ctx, "console-pipelines")

	// Resumed from the page, it reads the messages sent meanwhile.
	sendRegions(t, e, "orders", 3)
	click(t, ctx, `button[data-action=resume]`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`[data-state=running]`)))
	require.Eventually(t, func() bool {
		st, err := m.Get(bg, "audit")
		return err == nil && st.Counters.In == 3
	}, wait, 10*time.Millisecond, "the resumed pipeline reads what was sent while it was paused")
}

func TestBrowserTopicsArePagedByTheDaemon(t *testing.T) {
	ctx := browser(t)
	e := start(t, nil)
	for i := range 250 {
		require.NoError(t, e.b.CreateTopic(broker.TopicConfig{Name: fmt.Sprintf("t-%05d", i), ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}))
	}
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(e.srv.URL+"/#/topics"),
		chromedp.WaitVisible(`a[href="#/topics/t-00000"]`),
	))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('main tbody tr').length`))
	require.NoError(t, err)
	assert.Equal(t, 100, rows, "one page of 100")
	click(t, ctx, `.pager button:last-child`)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(`a[href="#/topics/t-00100"]`)))
	pager, err := chromedp.Run(ctx, chromedp.Text(`.pager`))
	require.NoError(t, err)
	assert.Contains(t, pager, "page 2 of")
	// The filter is applied by the daemon too: ten topics hold "t-0024".
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys(`#topic-filter`, "t-0024"), chromedp.WaitVisible(`a[href="#/topics/t-00249"]`)))
	require.Eventually(t, func() bool {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('main tbody tr').length`))
		return err == nil && n == 10
	}, wait, 20*time.Millisecond)
	pager, err = chromedp.Run(ctx, chromedp.Text(`.pager`))
	require.NoError(t, err)
	assert.Contains(t, pager, "10 topics")
}
