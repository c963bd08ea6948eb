package remoting

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// pendingCall is a call waiting for its response: an Invoke's channel or an InvokeAsync's
// callback (exactly one of the two is set).
type pendingCall struct {
	ch    chan *protocol.Command
	async *asyncCall
}

// asyncCall is an InvokeAsync waiting for its response. Whoever removes it from the pending
// table (the response, its timer, its context, the connection's close) finishes it, so it
// finishes once.
type asyncCall struct {
	c      *Conn
	opaque int32
	code   protocol.RequestCode
	done   func(*protocol.Command, error)
	// timer and stopCtx are set under pmu before the call can be taken out of the table.
	timer   *time.Timer
	stopCtx func() bool
}

// finish stops the call's clocks and calls its callback.
func (a *asyncCall) finish(resp *protocol.Command, err error) {
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.stopCtx != nil {
		a.stopCtx()
	}
	a.done(resp, err)
}

// abandon finishes the call with err if it is still pending.
func (a *asyncCall) abandon(err error) {
	c := a.c
	c.pmu.Lock()
	pc, ok := c.pending[a.opaque]
	if ok && pc.async == a {
		delete(c.pending, a.opaque)
	} else {
		ok = false
	}
	c.pmu.Unlock()
	if ok {
		a.finish(nil, err)
	}
}

func (a *asyncCall) expire() {
	a.abandon(fmt.Errorf("invoke %s on %s: %w", a.code, a.c.raddr, context.DeadlineExceeded))
}

// InvokeAsync sends req and returns without waiting for its response, or even for its write:
// done is called once with the response, or with an error when timeout passes first
// (wrapping context.DeadlineExceeded), when ctx ends first (wrapping its error), or when the
// connection closes (wrapping ErrConnClosed). A response that arrives later is dropped.
// timeout <= 0 means none beyond ctx.
//
// When InvokeAsync returns an error, nothing was sent and done is not called. Otherwise done
// runs on the connection's read goroutine (for a response, or the close: a Client's Close
// thus returns after it), or on a goroutine of the runtime (timeout, ctx): it must not
// block, and should hand any real work elsewhere. It may call InvokeAsync.
//
// Like Invoke, it sets req's opaque, flags and serialize type. The frame is queued for the
// connection's flusher, so requests sent in a row leave gathered in few writes. req, body
// included, is encoded into the frame before InvokeAsync returns: the caller may then reuse
// the body's buffer.
func (c *Conn) InvokeAsync(ctx context.Context, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) error {
	_, err := c.invokeAsync(ctx, req, timeout, done)
	return err
}

func (c *Conn) invokeAsync(ctx context.Context, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) (sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, err)
	}
	a := &asyncCall{c: c, code: req.RequestCode(), done: done}
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		return false, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	a.opaque = c.nextOpaqueLocked()
	c.pending[a.opaque] = pendingCall{async: a}
	if timeout > 0 {
		a.timer = time.AfterFunc(timeout, a.expire)
	}
	if ctx.Done() != nil {
		a.stopCtx = context.AfterFunc(ctx, func() {
			a.abandon(fmt.Errorf("invoke %s on %s: %w", a.code, c.raddr, context.Cause(ctx)))
		})
	}
	c.pmu.Unlock()

	req.Opaque = a.opaque
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	if err := c.queueCommand(req); err != nil {
		c.pmu.Lock()
		pc, mine := c.pending[a.opaque]
		mine = mine && pc.async == a
		if mine {
			delete(c.pending, a.opaque)
		}
		c.pmu.Unlock()
		if !mine {
			// Its timer, its context or the close took it first and calls done.
			return true, nil
		}
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.stopCtx != nil {
			a.stopCtx()
		}
		return false, fmt.Errorf("invoke %s: %w", req.RequestCode(), err)
	}
	return true, nil
}

// InvokeAsync sends req to addr and calls done with the outcome; see Conn.InvokeAsync. Only
// reaching a connection waits: on the first call to addr, for the dial, bounded by ctx. A
// connection found closed before anything was queued is redialed once.
func (cl *Client) InvokeAsync(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) error {
	for attempt := 0; ; attempt++ {
		c, err := cl.Conn(ctx, addr)
		if err != nil {
			return err
		}
		sent, err := c.invokeAsync(ctx, req, timeout, done)
		if err != nil && !sent && attempt == 0 && errors.Is(err, ErrConnClosed) {
			continue
		}
		return err
	}
}
