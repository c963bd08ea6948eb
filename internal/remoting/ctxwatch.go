package remoting

import (
	"context"
	"fmt"
)

// ctxWatch abandons, once its context ends, every InvokeAsync call of the connection pending
// with it (or with a context sharing its Done channel). A producer sends its whole stream
// with one context: one context.AfterFunc for the calls in flight together, rather than one
// registered and removed a call (that pair was 8 % of a producer's CPU). The calls are
// linked through their wprev and wnext; all of it is guarded by the connection's pmu.
type ctxWatch struct {
	ctx  context.Context
	done <-chan struct{}
	head *asyncCall
	stop func() bool
}

// watchLocked links the pending call a to the watch of ctx, starting one if none is
// running; pmu must be held and ctx.Done() non-nil. Keyed by the Done channel, which any
// context has comparable, where a context value itself may not be.
func (c *Conn) watchLocked(ctx context.Context, a *asyncCall) {
	done := ctx.Done()
	w := c.watches[done]
	if w == nil {
		if c.watches == nil {
			c.watches = make(map[<-chan struct{}]*ctxWatch)
		}
		w = &ctxWatch{ctx: ctx, done: done}
		c.watches[done] = w
		w.stop = context.AfterFunc(ctx, func() { c.ctxEnded(w) })
	}
	a.watch, a.wnext = w, w.head
	if w.head != nil {
		w.head.wprev = a
	}
	w.head = a
}

// unwatchLocked unlinks a call leaving the pending table from its watch, and ends the watch
// when no call is left on it (a context used once must not stay registered, nor in the
// map); pmu must be held. Stopping under pmu is safe: the context runs the watch's function
// on a goroutine of its own, which takes pmu after the context's lock is released.
func (a *asyncCall) unwatchLocked() {
	w := a.watch
	if w == nil {
		return
	}
	if a.wprev != nil {
		a.wprev.wnext = a.wnext
	} else {
		w.head = a.wnext
	}
	if a.wnext != nil {
		a.wnext.wprev = a.wprev
	}
	a.watch, a.wprev, a.wnext = nil, nil, nil
	if w.head == nil {
		w.stop()
		if c := a.c; c.watches[w.done] == w {
			delete(c.watches, w.done)
		}
	}
}

// ctxEnded abandons the calls pending on the watch, its context having ended.
func (c *Conn) ctxEnded(w *ctxWatch) {
	var ended []*asyncCall
	c.pmu.Lock()
	if c.watches[w.done] == w {
		delete(c.watches, w.done)
	}
	for a := w.head; a != nil; {
		next := a.wnext
		if a.takeLocked() { // unlinks a
			ended = append(ended, a)
		}
		a = next
	}
	w.head = nil
	c.pmu.Unlock()
	cause := context.Cause(w.ctx)
	for _, a := range ended {
		a.finish(nil, fmt.Errorf("invoke %s on %s: %w", a.code, c.raddr, cause))
	}
}

// stopWatchesLocked ends every watch as the connection closes (the close fails the calls);
// pmu must be held.
func (c *Conn) stopWatchesLocked() {
	for _, w := range c.watches {
		w.stop()
		w.head = nil
	}
	c.watches = nil
}
