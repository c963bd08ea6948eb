package remoting

// The pending-call table: the requests this side sent and waits for, by opaque (Invoke and
// InvokeOneway here, InvokeAsync in async.go). An opaque is in the table at most once;
// whoever takes a call out of it (its response, its deadline, its caller giving up, the
// close) completes it, so every call completes once. The table is nil once the connection has closed, and
// nothing is added to it after.

import (
	"context"
	"fmt"

	"github.com/flowd-io/flowd/protocol"
)

// Invoke sends req and waits for its response, for ctx to end, or for the connection to
// close.
//
// Invoke sets req.Opaque to a number unused on this connection, clears req's response and
// oneway flags, and sets req.Serialize to the connection's serialize type; req must not be
// shared with a concurrent call. An error that ends the wait wraps ctx.Err() or ErrConnClosed.
// A response that arrives after ctx ended is dropped.
func (c *Conn) Invoke(ctx context.Context, req *protocol.Command) (*protocol.Command, error) {
	resp, _, err := c.invoke(ctx, req)
	return resp, err
}

// InvokeOneway sends req with the oneway flag; there is no response. It returns once req has
// been written to the socket, or queued behind a write in progress whose writer will flush it.
// ctx is checked before sending: a write once started runs to completion or to the write
// timeout. Like Invoke, it sets req's opaque, flags and serialize type.
func (c *Conn) InvokeOneway(ctx context.Context, req *protocol.Command) error {
	_, err := c.invokeOneway(ctx, req)
	return err
}

func (c *Conn) invokeOneway(ctx context.Context, req *protocol.Command) (sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("invoke %s oneway on %s: %w", req.RequestCode(), c.raddr, err)
	}
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		return false, fmt.Errorf("invoke %s oneway: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	c.nextOpaque++
	req.Opaque = c.nextOpaque
	c.pmu.Unlock()
	req.Flag = req.Flag&^protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	sent, err = c.writeCommand(req)
	if err != nil {
		return sent, fmt.Errorf("invoke %s oneway: %w", req.RequestCode(), err)
	}
	return true, nil
}

// invoke is Invoke that also reports whether any of req may have reached the peer; a Client
// redials and retries only requests that certainly did not.
func (c *Conn) invoke(ctx context.Context, req *protocol.Command) (resp *protocol.Command, sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, err)
	}
	ch := c.cfg.getCall()
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		c.cfg.calls.Put(ch)
		return nil, false, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	opaque := c.nextOpaqueLocked()
	c.pending[opaque] = pendingCall{ch: ch}
	c.pmu.Unlock()

	req.Opaque = opaque
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	if sent, err := c.writeCommand(req); err != nil {
		c.forget(opaque, ch)
		return nil, sent, fmt.Errorf("invoke %s: %w", req.RequestCode(), err)
	}
	select {
	case resp := <-ch:
		c.cfg.calls.Put(ch) // deliver removed it from pending before sending its one value
		return resp, true, nil
	case <-ctx.Done():
		c.forget(opaque, ch)
		return nil, true, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, ctx.Err())
	case <-c.done:
		select {
		case resp := <-ch: // delivered just before the close
			return resp, true, nil
		default:
		}
		return nil, true, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err)
	}
}

// nextOpaqueLocked returns an opaque no pending call uses; pmu must be held.
func (c *Conn) nextOpaqueLocked() int32 {
	opaque := c.nextOpaque + 1
	for _, taken := c.pending[opaque]; taken; _, taken = c.pending[opaque] {
		opaque++ // only after 2^32 calls, with one still waiting
	}
	c.nextOpaque = opaque
	return opaque
}

// forget removes an abandoned call. If it was still pending nobody can send on ch any more
// and ch is recycled; otherwise deliver holds it and it is left to the garbage collector.
func (c *Conn) forget(opaque int32, ch chan *protocol.Command) {
	c.pmu.Lock()
	_, found := c.pending[opaque]
	if found {
		delete(c.pending, opaque)
	}
	c.pmu.Unlock()
	if found {
		c.cfg.calls.Put(ch)
	}
}

// deliver hands a response to the call waiting for it: an Invoke's channel, or an
// InvokeAsync's callback, which runs here, on the read goroutine. It reports whether nobody
// keeps resp, which the read goroutine may then decode the next frame into.
func (c *Conn) deliver(resp *protocol.Command) (reusable bool) {
	c.pmu.Lock()
	pc, ok := c.pending[resp.Opaque]
	if ok {
		delete(c.pending, resp.Opaque)
		if a := pc.async; a != nil {
			a.gone = true
			a.unwatchLocked()
			if a.lane != nil {
				a.lane.trimLocked()
			}
		}
	}
	c.pmu.Unlock()
	if !ok {
		// The caller gave up (its context ended) or the peer is confused; either way nobody
		// is waiting.
		c.log.Debug("dropping response nobody waits for", "opaque", resp.Opaque, "code", resp.ResponseCode())
		return true
	}
	if pc.async == nil || !pc.async.raw {
		resp.BuildExtFields() // read raw (see readLoop): this caller reads the map
	}
	if a := pc.async; a != nil {
		raw := a.raw // read before finish: the call may be reused once finished
		a.finish(resp, nil)
		return raw // a raw receiver keeps nothing of resp (see InvokeAsyncRaw)
	}
	pc.ch <- resp // buffered, and each channel gets one response
	return false
}
