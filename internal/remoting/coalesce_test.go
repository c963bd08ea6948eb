package remoting_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Many requests in flight on one connection, their frames and their responses' frames
// gathered into shared writes on both sides, each get their own answer.
func TestCoalescedWritesAnswerEachRequest(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{Logger: quietLogger(), MaxInFlightPerConn: 1024})
	c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger()})
	const goroutines, each = 64, 40
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			for j := range each {
				req := echoRequest(body(i, j))
				if j%2 == 1 {
					req.Body = make([]byte, 1024+i*j) // frames of many sizes share writes
					req.Body[0] = byte(i)
				}
				resp, err := c.Invoke(ctxTimeout(t, 10*time.Second), req)
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, protocol.Success, resp.ResponseCode())
				assert.Equal(t, body(i, j), resp.ExtFields["k"])
				assert.Equal(t, req.Body, resp.Body)
			}
		})
	}
	wg.Wait()
}

// A client that sends its next request as soon as it reads the previous response stays
// within a bound of one request in flight, and is never refused: the request stops counting
// when its response is written, not when its goroutine gets round to it afterwards.
func TestNextRequestAtTheInFlightBoundIsNotRefused(t *testing.T) {
	checkGoroutines(t)
	srv := startServer(t, newTestHandler(), remoting.ServerOptions{Logger: quietLogger(), MaxInFlightPerConn: 1})
	c := dial(t, srv.addr, remoting.ClientOptions{Logger: quietLogger()})
	for i := range 3000 {
		resp, err := c.Invoke(ctxTimeout(t, 5*time.Second), echoRequest(body(0, i)))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), "request %d: %s", i, resp.Remark)
	}
}
