package console

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
)

const wait = 15 * time.Second

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// env is a broker, an embedded NATS server (in-process, no listener), the event publisher,
// the command service and the console over a loopback test server.
type env struct {
	t   *testing.T
	b   *broker.Broker
	n   *control.NATS
	svc *control.Service
	pub *control.Publisher
	con *Server
	srv *httptest.Server
}

func start(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	return startWith(t, nil, mod)
}

// startWith is start with the command service's configuration changed by svcMod (a plugin
// registry, a pipeline manager on the started broker).
func startWith(t *testing.T, svcMod func(*broker.Broker, *control.ServiceConfig), mod func(*Config)) *env {
	t.Helper()
	ctx := context.Background()
	cfg := broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Logger: quiet()}
	cfg.Store.SegmentSize = 8 << 20
	b, err := broker.New(cfg)
	require.NoError(t, err)
	n, err := control.Open(ctx, control.NATSConfig{Listen: "off", StoreDir: t.TempDir(), Logger: quiet()})
	require.NoError(t, err)
	pub, err := control.NewPublisher(ctx, n, b, control.EventsConfig{Logger: quiet(), OffsetInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	pub.Started()
	scfg := control.ServiceConfig{Logger: quiet()}
	if svcMod != nil {
		svcMod(b, &scfg)
	}
	svc, err := control.StartService(ctx, n.Conn(), b, scfg)
	require.NoError(t, err)
	e := &env{t: t, b: b, n: n, svc: svc, pub: pub}
	ccfg := Config{Service: func() *control.Service { return e.svc }, Events: n.Conn(), Cluster: "local", Version: "test", Logger: quiet()}
	if mod != nil {
		mod(&ccfg)
	}
	e.con, err = New(ccfg)
	require.NoError(t, err)
	e.srv = httptest.NewServer(e.con)
	t.Cleanup(func() {
		e.con.Close()
		e.srv.Close()
		cctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		assert.NoError(t, svc.Stop())
		assert.NoError(t, b.Shutdown(cctx))
		assert.NoError(t, pub.Close(cctx))
		assert.NoError(t, n.Close(cctx))
	})
	return e
}

// call sends method path with body (and headers as "Key: value" pairs) and returns the
// status and body.
func (e *env) call(method, path, body string, headers ...string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	require.NoError(e.t, err)
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(e.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(e.t, err)
	return resp.StatusCode, string(raw)
}

// nats sends a command over NATS and returns its code (200 without an error) and body.
func (e *env) nats(cmd, body string) (int, string) {
	e.t.Helper()
	msg, err := e.n.Conn().Request("flowd.ctl.v1.local."+cmd, []byte(body), wait)
	require.NoError(e.t, err)
	code := 200
	if h := msg.Header.Get(micro.ErrorCodeHeader); h != "" {
		code, err = strconv.Atoi(h)
		require.NoError(e.t, err)
	}
	return code, string(msg.Data)
}

func TestAPIAnswersWhatNATSAnswers(t *testing.T) {
	e := start(t, nil)
	code, body := e.call("POST", "/api/v1/topic/create", `{"topic":"orders","queues":2}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"node":"broker-a","cluster":"local","topic":{"topic":"orders","read_queues":2,"write_queues":2,"perm":"rw","order":false,"kind":"user"}}`, body)
	for _, tc := range []struct{ cmd, body string }{
		{"topic.list", ``},
		{"topic.describe", `{"topic":"orders"}`},
		{"topic.describe", `{"topic":"missing"}`},
		{"topic.create", `{"topic":"orders","queues":2}`},
		{"topic.create", `{"topic":"x","queues":"two"}`},
		{"topic.create", `{"topic":"x","colour":"red"}`},
		{"topic.create", `[1,2]`},
		{"group.list", `{}`},
		{"group.describe", `{"group":"nobody"}`},
		{"group.reset_offset", `{"group":"g","topic":"orders","to":"earliest"}`},
		{"message.get", `{"msg_id":"zz"}`},
		{"message.query", `{"topic":"orders","key":"k"}`},
		{"topic.update", `{"topic":"orders","write_queues":3}`},
	} {
		natsCode, natsBody := e.nats(tc.cmd, tc.body)
		noun, verb, _ := strings.Cut(tc.cmd, ".")
		code, body := e.call("POST", "/api/v1/"+noun+"/"+verb, tc.body)
		assert.Equal(t, natsCode, code, "%s %s: %s", tc.cmd, tc.body, body)
		assert.Equal(t, natsBody, body, "%s %s", tc.cmd, tc.body)
	}
	// A GET of a read-only command takes the request from the query.
	natsCode, natsBody := e.nats("topic.describe", `{"topic":"orders"}`)
	code, body = e.call("GET", "/api/v1/topic/describe?topic=orders", "")
	assert.Equal(t, natsCode, code)
	assert.Equal(t, natsBody, body)
}

func TestAPIRefusesBadRequests(t *testing.T) {
	e := start(t, nil)
	for _, tc := range []struct {
		method, path, body string
		code               int
		msg                string
	}{
		{"POST", "/api/v1/topic/explode", `{}`, 404, "no command topic.explode"},
		{"GET", "/api/v1/topic/create?topic=a&queues=1", "", 405, "send it with POST"},
		{"POST", "/api/v1/topic/create", `{"topic":`, 400, "not valid JSON"},
		{"POST", "/api/v1/topic/create", `{"topic":"a","queues":0}`, 400, "queues"},
		{"GET", "/api/v1/topic/describe?topic=42", "", 404, "42"},
		{"GET", "/api/v1/topic/describe?queues=x", "", 400, "queues"},
		{"GET", "/api/v1/nothing", "", 404, "no API endpoint"},
		{"PUT", "/api/v1/topic/create", `{}`, 404, "no API endpoint PUT"},
		{"POST", "/api/v1/plugin/list", `{}`, 404, "no command plugin.list"},
	} {
		code, body := e.call(tc.method, tc.path, tc.body)
		assert.Equal(t, tc.code, code, "%s %s: %s", tc.method, tc.path, body)
		assert.Contains(t, body, tc.msg, "%s %s", tc.method, tc.path)
	}
	_, ok := e.b.Topic("a")
	assert.False(t, ok, "a GET created a topic")
}

func TestAPIWithoutServiceSaysNoDaemonAnswers(t *testing.T) {
	e := start(t, nil)
	e.con.cfg.Service = func() *control.Service { return nil }
	for _, path := range []string{"/api/v1/topic/list", "/api/v1/stats"} {
		code, body := e.call("GET", path, "")
		assert.Equal(t, http.StatusServiceUnavailable, code)
		assert.Contains(t, body, "no daemon answers")
	}
}

func TestAPIRoles(t *testing.T) {
	e := start(t, func(c *Config) {
		c.Token = "s3cret"
		c.Users = []User{{Name: "ops", Password: "pw-admin", Role: control.RoleAdmin}, {Name: "viewer", Password: "pw-read", Role: control.RoleRead}}
	})
	basic := func(u, p string) string {
		req, _ := http.NewRequest("GET", "/", nil)
		req.SetBasicAuth(u, p)
		return "Authorization: " + req.Header.Get("Authorization")
	}
	code, body := e.call("GET", "/api/v1/topic/list", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.Contains(t, body, "sign in")
	code, _ = e.call("GET", "/api/v1/topic/list", "", "Authorization: Bearer wrong")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, _ = e.call("GET", "/api/v1/topic/list", "", basic("viewer", "pw-admin"))
	assert.Equal(t, http.StatusUnauthorized, code)

	read := basic("viewer", "pw-read")
	code, _ = e.call("GET", "/api/v1/topic/list", "", read)
	assert.Equal(t, http.StatusOK, code)
	code, _ = e.call("POST", "/api/v1/topic/describe", `{"topic":"t"}`, read)
	assert.Equal(t, http.StatusNotFound, code, "a read-only command by POST is a read")
	code, body = e.call("POST", "/api/v1/topic/create", `{"topic":"t","queues":1}`, read)
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "you need the admin role for topic.create")
	_, ok := e.b.Topic("t")
	assert.False(t, ok)
	code, body = e.call("GET", "/api/v1/commands", "", read)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `{"name":"topic.create","read_only":false,"allowed":false}`)
	assert.Contains(t, body, `{"name":"topic.list","read_only":true,"allowed":true}`)

	code, body = e.call("POST", "/api/v1/topic/create", `{"topic":"t","queues":1}`, basic("ops", "pw-admin"))
	assert.Equal(t, http.StatusOK, code, body)
	code, body = e.call("POST", "/api/v1/topic/delete", `{"topic":"t"}`, "Authorization: Bearer s3cret")
	assert.Equal(t, http.StatusOK, code, body)
	code, body = e.call("GET", "/api/v1/session", "", "Authorization: Bearer s3cret")
	assert.Equal(t, http.StatusOK, code)
	assert.JSONEq(t, `{"user":"token","role":"admin","auth":true,"version":"test"}`, body)
	// The OpenAPI document is public.
	code, _ = e.call("GET", "/api/v1/openapi.json", "")
	assert.Equal(t, http.StatusOK, code)
}

func TestAPISessions(t *testing.T) {
	e := start(t, func(c *Config) {
		c.Users = []User{{Name: "viewer", Password: "pw-read", Role: control.RoleRead}, {Name: "ops", Password: "pw", Role: control.RoleAdmin}}
	})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	cl := &http.Client{Jar: jar}
	do := func(method, path, body string) (int, string) {
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := cl.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	code, body := do("POST", "/api/v1/session", `{"user":"viewer","password":"nope"}`)
	assert.Equal(t, http.StatusUnauthorized, code, body)
	code, _ = do("POST", "/api/v1/session", `{"who":"me"}`)
	assert.Equal(t, http.StatusBadRequest, code)
	code, body = do("POST", "/api/v1/session", `{"user":"viewer","password":"pw-read"}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.JSONEq(t, `{"user":"viewer","role":"read","auth":true,"version":"test"}`, body)
	code, _ = do("GET", "/api/v1/topic/list", "")
	assert.Equal(t, http.StatusOK, code)
	code, _ = do("POST", "/api/v1/topic/create", `{"topic":"s","queues":1}`)
	assert.Equal(t, http.StatusForbidden, code)
	code, _ = do("DELETE", "/api/v1/session", "")
	assert.Equal(t, http.StatusNoContent, code)
	code, _ = do("GET", "/api/v1/topic/list", "")
	assert.Equal(t, http.StatusUnauthorized, code, "signed out")
	code, _ = do("POST", "/api/v1/session", `{"user":"ops","password":"pw"}`)
	require.Equal(t, http.StatusOK, code)
	code, body = do("POST", "/api/v1/topic/create", `{"topic":"s","queues":1}`)
	assert.Equal(t, http.StatusOK, code, body)
}

func TestAPIRefusesCrossSiteChanges(t *testing.T) {
	e := start(t, nil)
	for _, h := range [][]string{
		{"Sec-Fetch-Site: cross-site"},
		{"Origin: http://evil.example"},
		{"Sec-Fetch-Site: same-site", "Origin: http://sub.example"},
	} {
		code, body := e.call("POST", "/api/v1/topic/create", `{"topic":"csrf","queues":1}`, h...)
		assert.Equal(t, http.StatusForbidden, code, "%v: %s", h, body)
		assert.Contains(t, body, "cross-origin request refused")
	}
	_, ok := e.b.Topic("csrf")
	assert.False(t, ok, "a cross-site request created a topic")
	// The page's own requests pass.
	code, body := e.call("POST", "/api/v1/topic/create", `{"topic":"csrf","queues":1}`, "Sec-Fetch-Site: same-origin", "Origin: "+e.srv.URL)
	assert.Equal(t, http.StatusOK, code, body)
}

func TestAPIWithoutCredentialsAnswersLoopbackNamesOnly(t *testing.T) {
	e := start(t, nil)
	code, body := e.call("GET", "/api/v1/topic/list", "", "Host: flowd.evil.example")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "loopback names only")
	req := httptest.NewRequest("GET", "/api/v1/session", nil)
	req.Host = "localhost:8080"
	rec := httptest.NewRecorder()
	e.con.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusOK, rec.Code)
	for host, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:8080": true, "localhost": true, "app.localhost:1": true, "10.0.0.1:8080": false, "example.com": false} {
		assert.Equal(t, want, loopbackHost(host), host)
	}
}

// sse reads a Server-Sent Events stream.
type sse struct {
	body io.Closer
	r    *bufio.Reader
}

func (e *env) stream(query string) *sse {
	e.t.Helper()
	resp, err := e.srv.Client().Get(e.srv.URL + "/api/v1/events" + query)
	require.NoError(e.t, err)
	require.Equal(e.t, http.StatusOK, resp.StatusCode)
	require.Equal(e.t, "text/event-stream", resp.Header.Get("Content-Type"))
	e.t.Cleanup(func() { resp.Body.Close() })
	s := &sse{body: resp.Body, r: bufio.NewReader(resp.Body)}
	return s
}

// next returns the next event's type and data, skipping comments.
func (s *sse) next(t *testing.T) (string, streamEvent) {
	t.Helper()
	var name string
	var ev streamEvent
	for {
		line, err := s.r.ReadString('\n')
		require.NoError(t, err)
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, "data: "):
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev))
			name = ev.Type
		case line == "" && name != "":
			return name, ev
		}
	}
}

func TestEventsStreamDeliversBrokerEvents(t *testing.T) {
	e := start(t, nil)
	all := e.stream("")
	topics := e.stream("?kinds=topic")
	groups := e.stream("?kinds=offset")
	code, body := e.call("POST", "/api/v1/topic/create", `{"topic":"live","queues":1}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = e.call("POST", "/api/v1/group/reset_offset", `{"group":"g1","topic":"live","to":"earliest"}`)
	require.Equal(t, http.StatusOK, code, body)

	name, ev := all.next(t)
	assert.Equal(t, "topic.created", name)
	assert.Equal(t, "topic.created", ev.Type)
	assert.Equal(t, "live", ev.Subject)
	assert.NotEmpty(t, ev.ID)
	assert.Contains(t, string(ev.Data), `"topic":"live"`)
	name, _ = topics.next(t)
	assert.Equal(t, "topic.created", name)
	// The group stream skipped the topic event: its first event is the group's.
	name, ev = groups.next(t)
	assert.True(t, strings.HasPrefix(name, "offset."), name)
	assert.Equal(t, "g1", ev.Subject)
}

func TestEventsFilter(t *testing.T) {
	assert.True(t, wanted("topic.created", nil))
	assert.True(t, wanted("topic.created", []string{"group", "topic"}))
	assert.True(t, wanted("plugin.fault", []string{"plugin.fault"}))
	assert.False(t, wanted("plugin.activated", []string{"plugin.fault"}))
	assert.False(t, wanted("topics.x", []string{"topic"}))
}

func TestOpenAPIListsEveryCommand(t *testing.T) {
	e := start(t, nil)
	code, body := e.call("GET", "/api/v1/openapi.json", "")
	require.Equal(t, http.StatusOK, code)
	var doc struct {
		OpenAPI string                               `json:"openapi"`
		Paths   map[string]map[string]map[string]any `json:"paths"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &doc))
	assert.Equal(t, "3.1.0", doc.OpenAPI)
	for _, name := range control.Commands() {
		noun, verb, _ := strings.Cut(name, ".")
		item, ok := doc.Paths["/api/v1/"+noun+"/"+verb]
		require.True(t, ok, name)
		assert.Contains(t, item, "post")
		_, hasGet := item["get"]
		assert.Equal(t, control.IsReadOnly(verb), hasGet, name)
		assert.NotContains(t, item["post"]["summary"], "command of the NATS control plane", "%s has no summary", name)
	}
	for _, p := range []string{"/api/v1/events", "/api/v1/stats", "/api/v1/session", "/api/v1/commands"} {
		assert.Contains(t, doc.Paths, p)
	}
}

func TestStatsAndPage(t *testing.T) {
	e := start(t, nil)
	code, body := e.call("POST", "/api/v1/topic/create", `{"topic":"st","queues":1}`)
	require.Equal(t, http.StatusOK, code, body)
	code, body = e.call("GET", "/api/v1/stats", "")
	require.Equal(t, http.StatusOK, code)
	var st control.StatsData
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.Contains(t, st.Topics, "st")

	code, body = e.call("GET", "/", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `src="/assets/app.js"`)
	for _, a := range []string{"/assets/app.js", "/assets/app.css"} {
		code, body = e.call("GET", a, "")
		assert.Equal(t, http.StatusOK, code, a)
		assert.NotEmpty(t, body, a)
	}
	code, _ = e.call("GET", "/assets/missing.js", "")
	assert.Equal(t, http.StatusNotFound, code)
}
