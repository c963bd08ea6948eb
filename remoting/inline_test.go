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

	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/remoting"
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
// whether Park accepted it in "parked"; ext field "inline" = "1" asks for it to be inline.
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
	resp.ExtFields["parked"] = strconv.FormatBool(remoting.Park(ctx))
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
