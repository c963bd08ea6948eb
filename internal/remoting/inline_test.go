package remoting_test

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// goroutineID is the id of the calling goroutine, from the first line of its stack trace
// ("goroutine 42 [running]:"): the only way to tell which goroutine serves a request.
func goroutineID() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	f := bytes.Fields(buf[:n])
	id, _ := strconv.ParseUint(string(f[1]), 10, 64)
	return id
}

// codeWhere answers with the id of the goroutine that served it in ext field "g", and
// whether Defer accepted it (a parked slot) in "parked"; ext field "inline" = "1" asks for
// it to be inline. A deferred request's returned answer goes out through its Deferred.
const codeWhere protocol.RequestCode = 1010

// inlineHandler is the test handler plus Inline: requests with ext field "inline" = "1" are
// served inline. It records the id of each connection's read goroutine (OnConnOpen runs on
// it).
type inlineHandler struct {
	*testHandler
	mu       sync.Mutex
	readGoID uint64
}

func (h *inlineHandler) Inline(req *protocol.Command) bool {
	if req.ExtFields["inline"] == "panic" {
		panic("inline boom")
	}
	return req.ExtFields["inline"] == "1"
}

func (h *inlineHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.RequestCode() != codeWhere {
		return h.testHandler.ServeRemoting(ctx, c, req)
	}
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.ExtFields["g"] = strconv.FormatUint(goroutineID(), 10)
	resp.ExtFields["servedInline"] = strconv.FormatBool(remoting.ServedInline(ctx))
	if req.ExtFields["direct"] == "1" {
		remoting.WriteAnswerDirect(ctx)
		resp.Body = bytes.Repeat([]byte("d"), 64<<10)
		return resp
	}
	_, parked := remoting.Defer(ctx, nil)
	resp.ExtFields["parked"] = strconv.FormatBool(parked)
	return resp
}

func (h *inlineHandler) opened(*remoting.Conn) {
	h.mu.Lock()
	h.readGoID = goroutineID()
	h.mu.Unlock()
}

func (h *inlineHandler) readGoroutine() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strconv.FormatUint(h.readGoID, 10)
}

func startInline(t *testing.T) (*inlineHandler, *remoting.Conn) {
	t.Helper()
	h := &inlineHandler{testHandler: newTestHandler()}
	srv := startServer(t, h, remoting.ServerOptions{OnConnOpen: h.opened})
	return h, dial(t, srv.addr, remoting.ClientOptions{})
}

func where(t *testing.T, c *remoting.Conn, inline string) *protocol.Command {
	t.Helper()
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(codeWhere, map[string]string{"inline": inline}, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	return resp
}

// A request the InlineHandler calls inline is served on the connection's read goroutine;
// the others on goroutines of their own.
func TestInlineRequestsServedOnTheReadGoroutine(t *testing.T) {
	checkGoroutines(t)
	h, c := startInline(t)
	for range 3 {
		resp := where(t, c, "1")
		assert.Equal(t, h.readGoroutine(), resp.ExtFields["g"], "served on the read goroutine")
		resp = where(t, c, "0")
		assert.NotEqual(t, h.readGoroutine(), resp.ExtFields["g"], "served on a goroutine of its own")
	}
}

// An inline request cannot park: waiting would stop the connection's reads.
func TestInlineRequestsCannotPark(t *testing.T) {
	checkGoroutines(t)
	_, c := startInline(t)
	assert.Equal(t, "false", where(t, c, "1").ExtFields["parked"])
	assert.Equal(t, "true", where(t, c, "0").ExtFields["parked"])
}

// A panic in an inline Handler call, or in Inline itself, is answered SYSTEM_ERROR (or
// served on a goroutine) and the connection goes on.
func TestInlinePanics(t *testing.T) {
	checkGoroutines(t)
	h, c := startInline(t)
	resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(codePanic, map[string]string{"inline": "1"}, nil))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, "boom")

	resp = where(t, c, "panic")
	assert.NotEqual(t, h.readGoroutine(), resp.ExtFields["g"], "Inline panicked: served as usual")
	assert.Equal(t, h.readGoroutine(), where(t, c, "1").ExtFields["g"], "the connection goes on")
}

// A request blocked on its own goroutine does not hold back an inline one behind it.
func TestInlineNotHeldBackByABlockedRequest(t *testing.T) {
	checkGoroutines(t)
	h, c := startInline(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, nil))
		done <- err
	}()
	recv(t, h.entered, "the blocked request")
	assert.Equal(t, h.readGoroutine(), where(t, c, "1").ExtFields["g"])
	close(h.release)
	require.NoError(t, recv(t, done, "the blocked request's answer"))
}

// rawExtHandler reads its requests' fields with Ext, and says whether they came as a map.
type rawExtHandler struct{}

func (rawExtHandler) RawExt(code protocol.RequestCode) bool { return code == codeEcho }

func (rawExtHandler) ServeRemoting(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
	resp := protocol.NewResponse(req, protocol.Success, "")
	resp.ExtFields["k"] = req.Ext("k")
	resp.ExtFields["map"] = strconv.FormatBool(req.ExtFields != nil)
	return resp
}

// A RawExtHandler gets the binary requests it names without their ExtFields map, and JSON
// ones with it.
func TestRawExtHandler(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, rawExtHandler{}, remoting.ServerOptions{})
	for st, wantMap := range map[protocol.SerializeType]string{protocol.RocketMQ: "false", protocol.JSON: "true"} {
		c := dial(t, srv.addr, remoting.ClientOptions{Serialize: st})
		resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), echoRequest("v"))
		require.NoError(t, err)
		assert.Equal(t, "v", resp.ExtFields["k"], st)
		assert.Equal(t, wantMap, resp.ExtFields["map"], st)
	}
}

// lendingHandler lends inline requests their body (remoting.LendingInlineHandler): those
// with ext field "inline" = "1" are served inline and echoed with a copy of the body; the
// others are the test handler's, which keep the body (codeBlock echoes it once released).
type lendingHandler struct{ *testHandler }

func (h lendingHandler) Inline(req *protocol.Command) bool { return req.Ext("inline") == "1" }

func (h lendingHandler) LendInlineBody() {}

func (h lendingHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.Ext("inline") == "1" {
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = bytes.Clone(req.Body)
		return resp
	}
	return h.testHandler.ServeRemoting(ctx, c, req)
}

func lentBody(i int, n int) []byte { return bytes.Repeat([]byte{byte('a' + i%26)}, n) }

// With a LendingInlineHandler, an inline request reads its body from the read buffer, but a
// request handed to a goroutine of its own keeps its body intact while the read goroutine
// reads (and overwrites the buffer with) many more frames; so do responses read on a
// lending connection, while their callers are slower than the read goroutine.
func TestLendingInlineHandlerBodies(t *testing.T) {
	checkGoroutines(t)
	h := lendingHandler{newTestHandler()}
	srv := startServer(t, h, remoting.ServerOptions{})
	c := dial(t, srv.addr, remoting.ClientOptions{Handler: h})

	held := []byte("held by a request served on its own goroutine")
	done := make(chan *protocol.Command, 1)
	go func() {
		resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), protocol.NewRequest(codeBlock, nil, held))
		assert.NoError(t, err)
		done <- resp
	}()
	recv(t, h.entered, "the blocked request")

	// Inline requests, bodies of 1 KiB, enough to cycle the 16 KiB read buffer many times;
	// their responses come back on the client's lending connection and are checked only
	// once all have arrived.
	const n = 200
	resps := make([]chan *protocol.Command, n)
	for i := range n {
		resps[i] = make(chan *protocol.Command, 1)
		req := protocol.NewRequest(codeEcho, map[string]string{"inline": "1"}, lentBody(i, 1024))
		require.NoError(t, c.InvokeAsync(ctxTimeout(t, 5*time.Second), req, 5*time.Second, func(resp *protocol.Command, err error) {
			assert.NoError(t, err)
			resps[i] <- resp
		}))
	}
	got := make([]*protocol.Command, n)
	for i := range n {
		got[i] = recv(t, resps[i], "an inline answer")
		require.NotNil(t, got[i])
	}
	for i, resp := range got {
		assert.Equal(t, lentBody(i, 1024), resp.Body, "response %d", i)
	}
	close(h.release)
	resp := recv(t, done, "the blocked request's answer")
	require.NotNil(t, resp)
	assert.Equal(t, string(held), string(resp.Body), "the body of a request not served inline is its own")
}

// ServedInline tells a Handler where it runs; an answer written directly (WriteAnswerDirect)
// arrives whole, from the read goroutine or a goroutine of its own, and the connection goes on.
func TestInlineServedInlineAndDirectAnswers(t *testing.T) {
	checkGoroutines(t)
	_, c := startInline(t)
	assert.Equal(t, "true", where(t, c, "1").ExtFields["servedInline"])
	assert.Equal(t, "false", where(t, c, "0").ExtFields["servedInline"])
	for _, inline := range []string{"1", "0"} {
		for range 3 {
			resp, err := c.Invoke(ctxTimeout(t, 3*time.Second), protocol.NewRequest(codeWhere, map[string]string{"inline": inline, "direct": "1"}, nil))
			require.NoError(t, err)
			require.Equal(t, protocol.Success, resp.ResponseCode())
			assert.Equal(t, bytes.Repeat([]byte("d"), 64<<10), resp.Body)
		}
	}
	assert.Equal(t, "true", where(t, c, "1").ExtFields["servedInline"])
}
