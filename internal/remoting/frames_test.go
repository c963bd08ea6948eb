package remoting_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
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

// jsonFrame builds a frame with the given JSON header text and no body.
func jsonFrame(header string) []byte {
	return rawFrame(uint32(4+len(header)), uint32(len(header)), header)
}

// A frame that arrives whole but whose header cannot be read is answered, when its opaque
// can be read, and the connection goes on serving: only that request is lost.
func TestMalformedHeaderKeepsTheConnection(t *testing.T) {
	checkGoroutines(t)
	closed := make(chan error, 1)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{
		OnConnClose: func(c *remoting.Conn) { closed <- c.Err() },
	})
	binBad := []byte{0x03, 0xE8, 0x09, 0x01, 0x3D, 0, 0, 0, 12, 0, 0, 0, 0, 0, 0, 0, 0, 'x'} // opaque 12, a stray byte
	cases := []struct {
		name   string
		frame  []byte
		answer bool // whether an error response comes back
		opaque int32
		st     protocol.SerializeType
		remark string
	}{
		{"field of the wrong type", jsonFrame(`{"code":1000,"opaque":7,"flag":0,"version":"x"}`), true, 7, protocol.JSON, `header field "version": "x" is not an int16`},
		{"wrong type before the opaque", jsonFrame(`{"code":1000,"extFields":"k","opaque":9}`), true, 9, protocol.JSON, `header field "extFields"`},
		{"syntax error after the opaque", jsonFrame(`{"opaque":8,"code":1000,"extFields":{"k":-}}`), true, 8, protocol.JSON, `(key "k")`},
		{"binary header with a stray byte", rawFrame(uint32(4+len(binBad)), 0x01000000|uint32(len(binBad)), string(binBad)), true, 12, protocol.RocketMQ, "truncated ext fields length"},
		{"syntax error before any opaque", jsonFrame(`{nope`), false, 0, 0, ""},
		{"unknown serialize type", rawFrame(6, 0x05000002, "ab"), false, 0, 0, ""},
		{"oneway", jsonFrame(`{"code":1000,"opaque":10,"flag":2,"version":"x"}`), false, 0, 0, ""},
	}
	nc, err := net.Dial("tcp", srv.addr)
	require.NoError(t, err)
	defer nc.Close()
	br := bufio.NewReader(nc)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The bad frame and a good request behind it, in one write.
			good := echoRequest(tc.name)
			good.Opaque = int32(1000 + i)
			_, err := nc.Write(append(append([]byte{}, tc.frame...), encode(t, good)...))
			require.NoError(t, err)
			require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
			if tc.answer {
				resp, err := protocol.ReadFrame(br, 0)
				require.NoError(t, err)
				assert.True(t, resp.IsResponse())
				assert.Equal(t, tc.opaque, resp.Opaque)
				assert.Equal(t, tc.st, resp.Serialize, "answered in the request's serialize type")
				assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
				assert.Contains(t, resp.Remark, tc.remark)
			}
			resp, err := protocol.ReadFrame(br, 0)
			require.NoError(t, err, "the connection is still served")
			assert.Equal(t, good.Opaque, resp.Opaque, "nothing else was answered")
			assert.Equal(t, protocol.Success, resp.ResponseCode())
			assert.Equal(t, tc.name, string(resp.Body))
		})
	}
	select {
	case err := <-closed:
		t.Fatalf("the connection was closed: %v", err)
	default:
	}
}

// A response whose header cannot be read completes the call waiting for it with an error
// response, rather than leaving it to its timeout or closing the connection.
func TestMalformedResponseHeaderCompletesTheCall(t *testing.T) {
	checkGoroutines(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			nc, err := ln.Accept()
			if err != nil {
				return err
			}
			defer nc.Close()
			br := bufio.NewReader(nc)
			for i := range 2 {
				req, err := protocol.ReadFrame(br, 0)
				if err != nil {
					return err
				}
				var frame []byte
				if i == 0 {
					frame = jsonFrame(`{"code":0,"flag":1,"opaque":` + strconv.Itoa(int(req.Opaque)) + `,"remark":7}`)
				} else {
					frame = encode(t, echo(req))
				}
				if _, err := nc.Write(frame); err != nil {
					return err
				}
			}
			_, err = io.Copy(io.Discard, nc)
			return err
		}()
	}()
	c := dial(t, ln.Addr().String(), remoting.ClientOptions{})
	resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), echoRequest("first"))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Contains(t, resp.Remark, `header field "remark"`)
	requireEcho(t, c, "second")
	require.NoError(t, c.Close())
	require.NoError(t, recv(t, served, "the raw server"))
}

// A peer that announces a large frame and stalls holds memory for what it sent, not for
// what it announced, and is disconnected once its frame has been arriving for longer than
// FrameReadTimeout. A connection that is merely quiet between frames for that long is not.
func TestStalledFramesHoldLittleAndAreClosed(t *testing.T) {
	checkGoroutines(t)
	const (
		conns   = 1000
		sent    = 4 << 10
		timeout = 2 * time.Second
	)
	type closeEvent struct {
		peer string
		at   time.Time
		err  error
	}
	closed := make(chan closeEvent, conns+1)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{
		FrameReadTimeout: timeout,
		IdleTimeout:      -1,
		OnConnClose:      func(c *remoting.Conn) { closed <- closeEvent{c.RemoteAddr().String(), time.Now(), c.Err()} },
	})
	quiet := dial(t, srv.addr, remoting.ClientOptions{})
	requireEcho(t, quiet, "before")

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	stall := append(binary.BigEndian.AppendUint32(nil, protocol.MaxFrameSize), make([]byte, sent)...)
	binary.BigEndian.PutUint32(stall[4:], 200) // a JSON header mark; the header never comes
	ncs := make([]net.Conn, 0, conns)
	defer func() {
		for _, nc := range ncs {
			_ = nc.Close()
		}
	}()
	began := make(map[string]time.Time, conns) // by the client's address: the server's peer
	for range conns {
		nc, err := net.Dial("tcp", srv.addr)
		require.NoError(t, err)
		ncs = append(ncs, nc)
		began[nc.LocalAddr().String()] = time.Now()
		_, err = nc.Write(stall)
		require.NoError(t, err)
	}

	// Every stalled connection is closed by the server, each for its stalled frame.
	for _, nc := range ncs {
		require.NoError(t, nc.SetReadDeadline(time.Now().Add(30*time.Second)))
		_, err := io.Copy(io.Discard, nc)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server closed the stalled connection")
	}
	for range conns {
		ev := recv(t, closed, "OnConnClose of a stalled connection")
		require.ErrorIs(t, ev.err, remoting.ErrConnClosed)
		require.ErrorContains(t, ev.err, "stalled mid-frame")
		start, ok := began[ev.peer]
		require.True(t, ok, "closed %s, which is not a stalled connection", ev.peer)
		require.GreaterOrEqual(t, ev.at.Sub(start), timeout, "closed only once its frame had been arriving for FrameReadTimeout")
	}
	runtime.ReadMemStats(&after)
	grown := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %d MiB for %d stalled frames of 16 MiB", grown>>20, conns)
	require.Less(t, grown, uint64(256<<20), "memory follows the bytes received, not the lengths announced")

	// The quiet connection outlived the frame timeout of frames that began after its last one.
	requireEcho(t, quiet, "after")
	require.NoError(t, quiet.Err())
}

// The connection cap refuses connections beyond it at accept; the open ones keep working,
// and a slot freed by a close can be taken again.
func TestMaxConns(t *testing.T) {
	checkGoroutines(t)
	logs := &syncBuffer{}
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{MaxConns: 2, Logger: slogTo(logs)})
	first := dial(t, srv.addr, remoting.ClientOptions{})
	second := dial(t, srv.addr, remoting.ClientOptions{})
	requireEcho(t, first, "1")
	requireEcho(t, second, "2")

	// The third is accepted by the kernel, then closed by the server without being served.
	nc, err := net.Dial("tcp", srv.addr)
	require.NoError(t, err)
	defer nc.Close()
	req := echoRequest("3")
	req.Opaque = 3
	_, _ = nc.Write(encode(t, req)) // may fail if the close came first
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := io.Copy(io.Discard, nc)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server closed the connection beyond the cap")
	assert.Zero(t, n, "and did not serve it")
	assert.Contains(t, logs.String(), "refusing connection: too many open")

	requireEcho(t, first, "1 again")
	requireEcho(t, second, "2 again")

	// Once one closes, a new connection is served.
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c, err := remoting.Dial(ctx, srv.addr, remoting.ClientOptions{Logger: quietLogger()})
		if err != nil {
			return false
		}
		defer c.Close()
		resp, err := c.Invoke(ctx, echoRequest("third"))
		return err == nil && resp.ResponseCode() == protocol.Success
	}, 5*time.Second, 10*time.Millisecond)
}

// codePark parks: it defers the request (Defer), reports on parked, and answers it once
// release is closed. If Defer refuses, it answers at once with the remark "not parked".
const codePark protocol.RequestCode = 1010

type parkHandler struct {
	*testHandler
	parked chan struct{}
}

func (h *parkHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.RequestCode() != codePark {
		return h.testHandler.ServeRemoting(ctx, c, req)
	}
	d, ok := remoting.Defer(ctx, nil)
	if !ok {
		return protocol.NewResponse(req, protocol.Success, "not parked")
	}
	go func() {
		select {
		case <-h.release:
			d.Respond(protocol.NewResponse(req, protocol.Success, "parked"))
		case <-d.Context().Done():
		}
	}()
	h.parked <- struct{}{}
	return nil
}

// invokeServed invokes req, again while the answer is SYSTEM_BUSY, for up to 5 s.
func invokeServed(t *testing.T, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), req)
		require.NoError(t, err)
		if resp.ResponseCode() != protocol.SystemBusy {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused as busy for 5 s: %s", resp.Remark)
		}
		time.Sleep(time.Millisecond)
	}
}

// Parked requests do not count against the in-flight bound, so that requests parked for an
// event (long-polling pulls) never starve the connection's other traffic; they have a bound
// of their own, and Defer reports when it is reached.
func TestParkedRequestsLeaveInFlightSlots(t *testing.T) {
	checkGoroutines(t)
	h := &parkHandler{testHandler: newTestHandler(), parked: make(chan struct{}, 16)}
	srv := startServer(t, h, remoting.ServerOptions{MaxInFlightPerConn: 1, MaxParkedPerConn: 3})
	c := dial(t, srv.addr, remoting.ClientOptions{})

	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			resp, err := c.Invoke(ctxTimeout(t, 10*time.Second), protocol.NewRequest(codePark, nil, nil))
			if assert.NoError(t, err) {
				assert.Equal(t, "parked", resp.Remark)
			}
		})
		// One at a time: with one in-flight slot, the next is admitted once this one parked.
		recv(t, h.parked, "a parked request")
	}

	// More parked requests than in-flight slots, and the connection still serves. (Each
	// request's in-flight slot is freed after its response is written, so the next one may
	// briefly find it taken.)
	resp := invokeServed(t, c, echoRequest("while parked"))
	assert.Equal(t, "while parked", string(resp.Body))

	// The parked bound is reached: the handler is told at once.
	resp = invokeServed(t, c, protocol.NewRequest(codePark, nil, nil))
	assert.Equal(t, "not parked", resp.Remark)

	close(h.release)
	wg.Wait()

	// Finished parked requests gave their slots back.
	for range 3 {
		resp := invokeServed(t, c, protocol.NewRequest(codePark, nil, nil))
		assert.Equal(t, "parked", resp.Remark)
		recv(t, h.parked, "a parked request")
	}
}
