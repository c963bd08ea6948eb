package control_test

import (
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// searchAll pages through a search with max_matches per page, following next as positions
// until the search stops on no bound, and returns the bodies matched.
func searchAll(t *testing.T, e *env, req map[string]any) []string {
	t.Helper()
	var bodies []string
	for page := 0; ; page++ {
		require.Less(t, page, 50, "the search does not end")
		var r control.MessageSearchReply
		e.ok("message.search", jsonString(t, req), &r)
		for _, m := range r.Matches {
			bodies = append(bodies, string(m.Body))
		}
		if r.Stopped == "" {
			return bodies
		}
		req["positions"] = r.Next
	}
}

func TestMessageSearchSQL92(t *testing.T) {
	e := start(t, nil)
	e.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	sendTo(t, e, "orders", 0, 7)
	sendTo(t, e, "orders", 1, 4)

	var r control.MessageSearchReply
	e.ok("message.search", `{"topic":"orders","sql92":"region = 'eu'"}`, &r)
	assert.Empty(t, r.Stopped, "every queue scanned to its end")
	assert.Equal(t, 11, r.Scanned)
	var got []string
	for _, m := range r.Matches {
		got = append(got, string(m.Body))
		assert.Equal(t, "eu", m.Properties["region"])
	}
	assert.Equal(t, []string{"q0-0", "q0-2", "q0-4", "q0-6", "q1-0", "q1-2"}, got)
	assert.Equal(t, map[string]int64{"0": 7, "1": 4}, r.Next, "each queue at its end")

	// Paged two matches at a time, the pages hold each match once.
	assert.Equal(t, got, searchAll(t, e, map[string]any{"topic": "orders", "sql92": "region = 'eu'", "max_matches": 2}))

	e.ok("message.search", `{"topic":"orders","sql92":"region = 'eu'","max_matches":2}`, &r)
	assert.Equal(t, "max_matches", r.Stopped)
	assert.Equal(t, map[string]int64{"0": 3, "1": 0}, r.Next, "queue 0 after its second match, queue 1 not reached")

	e.ok("message.search", `{"topic":"orders","sql92":"TAGS = 't1'","max_scan":5}`, &r)
	assert.Equal(t, "max_scan", r.Stopped)
	assert.Equal(t, 5, r.Scanned)
	require.Len(t, r.Matches, 2) // q0-1 and q0-4
	assert.Equal(t, int64(5), r.Next["0"])

	e.ok("message.search", `{"topic":"orders","queue":1,"from_offset":1,"sql92":"region IS NOT NULL"}`, &r)
	assert.Equal(t, 3, r.Scanned)
	assert.Equal(t, "q1-1", string(r.Matches[0].Body))
	e.ok("message.search", `{"topic":"orders","from_time":"2100-01-01T00:00:00Z","sql92":"region = 'eu'"}`, &r)
	assert.Empty(t, r.Matches)
	r = control.MessageSearchReply{}
	e.ok("message.search", `{"topic":"orders","to":1,"sql92":"region = 'eu'"}`, &r)
	assert.Empty(t, r.Matches, "nothing stored before 1970-01-01T00:00:00.001Z")
	assert.Empty(t, r.Next, "every queue reached to")

	for _, c := range []struct {
		body string
		code int
		want string
	}{
		{`{"sql92":"a = 1"}`, control.CodeBadRequest, `field "topic": required`},
		{`{"topic":"nope","sql92":"a = 1"}`, control.CodeNotFound, `topic "nope"`},
		{`{"topic":"orders"}`, control.CodeBadRequest, `field "sql92": give sql92 or filter`},
		{`{"topic":"orders","sql92":"region = AND"}`, control.CodeBadRequest, `field "sql92": `},
		{`{"topic":"orders","sql92":"a = 1","filter":"f"}`, control.CodeBadRequest, `field "filter": give sql92 or filter, not both`},
		{`{"topic":"orders","filter":"f"}`, control.CodeBadRequest, `field "filter": this node has no plugin registry`},
		{`{"topic":"orders","sql92":"a = 1","max_scan":0}`, control.CodeBadRequest, `field "max_scan": `},
		{`{"topic":"orders","sql92":"a = 1","max_scan":100001}`, control.CodeBadRequest, `field "max_scan": `},
		{`{"topic":"orders","sql92":"a = 1","max_matches":101}`, control.CodeBadRequest, `field "max_matches": `},
		{`{"topic":"orders","sql92":"a = 1","timeout":"soon"}`, control.CodeBadRequest, `field "timeout": `},
		{`{"topic":"orders","sql92":"a = 1","timeout":"11s"}`, control.CodeBadRequest, `field "timeout": `},
		{`{"topic":"orders","sql92":"a = 1","queue":2}`, control.CodeBadRequest, `field "queue": `},
		{`{"topic":"orders","sql92":"a = 1","from_offset":1,"from_time":1}`, control.CodeBadRequest, `field "from_time": `},
		{`{"topic":"orders","sql92":"a = 1","positions":{"x":1}}`, control.CodeBadRequest, `field "positions": `},
		{`{"topic":"orders","sql92":"a = 1","to":"later"}`, control.CodeBadRequest, `field "to": `},
	} {
		t.Run(c.body, func(t *testing.T) {
			assert.Contains(t, e.fail("message.search", c.body, c.code), c.want)
		})
	}
}

func TestMessageSearchWasmFilter(t *testing.T) {
	pe := startWithPlugins(t)
	wasm := propfilterModule(t)
	pe.ok("plugin.deploy", jsonString(t, map[string]any{"manifest": manifestJSON(t, "1.0.0", wasm, nil), "module": base64.StdEncoding.EncodeToString(wasm), "activate": true}), nil)
	pe.ok("topic.create", `{"topic":"orders","queues":2}`, nil)
	sendTo(t, pe.env, "orders", 0, 5)
	sendTo(t, pe.env, "orders", 1, 3)

	// The deployed filter keeps region = eu (its manifest's parameters).
	got := searchAll(t, pe.env, map[string]any{"topic": "orders", "filter": "region", "max_matches": 2})
	assert.Equal(t, []string{"q0-0", "q0-2", "q0-4", "q1-0", "q1-2"}, got)

	var list control.PluginListReply
	pe.ok("plugin.list", `{"name":"region"}`, &list)
	require.Len(t, list.Plugins, 1)
	require.NotNil(t, list.Plugins[0].Stats)
	assert.Positive(t, list.Plugins[0].Stats.Calls, "the search called the filter")
	assert.Zero(t, list.Plugins[0].Stats.FaultsTotal)

	msg := pe.request("message.search", `{"topic":"orders","filter":"nope"}`)
	var reply control.ErrorReply
	require.NoError(t, json.Unmarshal(msg.Data, &reply))
	assert.Equal(t, control.CodeBadRequest, reply.Error.Code)
	assert.Contains(t, reply.Error.Message, `field "filter": `)
}
