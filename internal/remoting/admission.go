package remoting

// Request admission, workers and shedding. A request read from the connection is admitted
// under the in-flight bound while the server is not draining, or refused (SYSTEM_BUSY; a
// oneway one is dropped); then it is served inline on the read goroutine, by a worker
// waiting for one, or on a new goroutine. Its requestCtx goes from reqInFlight to
// reqFinished, through reqParked when its Handler defers it (Defer, in deferred.go).
// A connection that stays quiet for a sweep sheds its waiting workers and spare buffers.
//
// Invariants: from admission until its response is written, a request counts in inflight,
// parked or responding, and it is counted in the next before it leaves the previous, so
// that Shutdown and the idle sweeper (which read inflight first) always see it; every
// admitted request is in handlers until its Handler returns; at most maxIdleWorkers workers
// wait for work, and a nil sent on work (shed) ends one.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/flowd-io/flowd/protocol"
)

// maxIdleWorkers bounds the goroutines a connection keeps waiting for its next request.
const maxIdleWorkers = 16

// dispatch admits a request and serves it on its own goroutine, or refuses it.
//
// lent says that req.Body is borrowed from the read buffer (see LendingInlineHandler): it
// is copied unless req is served inline.
func (c *Conn) dispatch(req *protocol.Command, lent bool) {
	if c.cfg.mirrorPeer && uint32(req.Serialize) != c.serialize.Load() {
		c.serialize.Store(uint32(req.Serialize))
	}
	// Count first, then look at the drain flag: Shutdown sets the flag, then reads the count.
	// Whichever order the two goroutines run in, either Shutdown sees this request in flight
	// or this request sees the flag (both are sequentially consistent atomics).
	n := c.inflight.Add(1)
	var refuse string
	switch {
	case c.cfg.draining != nil && c.cfg.draining.Load():
		refuse = "server is shutting down"
	case n > c.cfg.maxInFlight:
		refuse = "too many requests in flight on this connection"
	}
	if refuse != "" {
		c.inflight.Add(-1)
		if req.IsOneway() {
			c.log.Warn("dropping oneway request", "code", req.RequestCode(), "reason", refuse)
			return
		}
		c.log.Debug("refusing request", "code", req.RequestCode(), "reason", refuse)
		c.respond(req, protocol.NewResponse(req, protocol.SystemBusy, refuse))
		return
	}
	c.handlers.Add(1)
	if c.cfg.inline != nil && c.askInline(req) {
		c.serve(req, true)
		return
	}
	if lent {
		req.Body = bytes.Clone(req.Body)
	}
	select {
	case c.work <- req: // an idle worker takes it
	default:
		go c.worker(req)
	}
}

// worker serves req and then, while fewer than maxIdleWorkers others wait, waits for the
// next request of the connection instead of exiting. A fresh goroutine per request grows its
// stack from the minimum through the Handler's call chain every time; a kept one has grown
// it once. Workers waiting are not in flight and end when the connection closes.
func (c *Conn) worker(req *protocol.Command) {
	for {
		c.serve(req, false)
		if c.idleWorkers.Add(1) > maxIdleWorkers {
			c.idleWorkers.Add(-1)
			return
		}
		select {
		case req = <-c.work:
			c.idleWorkers.Add(-1)
			if req == nil { // shed: the connection went idle
				return
			}
		case <-c.done:
			c.idleWorkers.Add(-1)
			return
		}
	}
}

// shed lets go of what a connection keeps only to serve its next burst faster: the request
// goroutines waiting for work (each with a stack grown through the Handler, up to
// maxIdleWorkers of them) and the buffers its last batches of frames were encoded and
// gathered in (up to maxGatheredWrite each). The Server's sweeper calls it on connections that stayed idle for a
// sweep, so that many idle connections cost little more than their read goroutine and read
// buffer; both come back with the next traffic.
func (c *Conn) shed() {
	for c.idleWorkers.Load() > 0 {
		select {
		case c.work <- nil:
		default:
			return // the worker counted has not reached its wait yet, or took a request
		}
	}
	if c.wmu.TryLock() {
		c.wbuf = nil
		c.wmu.Unlock()
	}
	c.qmu.Lock()
	c.qspare = nil
	if len(c.qbuf) == 0 {
		c.qbuf = nil
	}
	c.qmu.Unlock()
}

// askInline asks the InlineHandler whether req may be served on the read goroutine. A
// panic in Inline is logged and taken as a no: the request is then served (and its panic,
// if any, answered) on its own goroutine.
func (c *Conn) askInline(req *protocol.Command) (inline bool) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("Inline panicked", "code", req.RequestCode(), "opaque", req.Opaque, "panic", r, "stack", string(debug.Stack()))
			inline = false
		}
	}()
	return c.cfg.inline.Inline(req)
}

// serve runs the Handler for req and queues its response; inline says that this is the
// read goroutine (see InlineHandler).
func (c *Conn) serve(req *protocol.Command, inline bool) {
	rc := &requestCtx{Context: c.ctx, c: c, inline: inline, code: req.Code, opaque: req.Opaque,
		serialize: req.Serialize, oneway: req.IsOneway()}
	defer c.handlers.Done()
	resp := c.callHandler(rc, req)
	if rc.deferred {
		// The request's slot and its answer belong to its Deferred now. A Handler that
		// deferred and still returned a response (a panic's SYSTEM_ERROR, say) answers
		// through it: whichever comes first goes out.
		if resp != nil {
			Deferred{rc}.Respond(resp)
		}
		c.activity.Add(1)
		return
	}
	answer := resp != nil && !req.IsOneway()
	files := rc.fileResp != nil && rc.fileResp == resp && answer
	if rc.fileResp != nil && !files && rc.fileRelease != nil {
		rc.fileRelease() // the Handler answered otherwise: the regions are not sent
	}
	if answer {
		// Counted as responding before it stops counting in flight, so that Shutdown and the
		// idle sweeper, which read in flight first, always see it in one or the other.
		c.responding.Add(1)
	}
	// The request leaves the in-flight bound before its response is written: a peer that
	// sends its next request as soon as it reads this response, at the bound, must not be
	// refused because this goroutine has not yet been scheduled after the write.
	if rc.state.Swap(reqFinished) == reqParked {
		c.parked.Add(-1)
	} else {
		c.inflight.Add(-1)
	}
	if answer {
		switch {
		case files:
			c.respondFiles(req, resp, rc.fileRegions, rc.fileRelease)
		case rc.direct:
			c.respondDirect(req, resp)
		default:
			c.respond(req, resp)
		}
		c.responding.Add(-1)
	}
	c.activity.Add(1)
}

// States of a request being served, for Defer.
const (
	reqInFlight int32 = iota
	reqParked
	reqFinished
)

// requestCtx is the context a Handler is called with: the connection's, plus what Defer
// needs to find the request. One allocation per request carries both.
type requestCtx struct {
	context.Context
	c     *Conn
	state atomic.Int32 // reqInFlight, reqParked or reqFinished
	// inline: served on the read goroutine, which must not wait (Defer refuses).
	inline bool
	oneway bool
	// direct: the answer is written by the serving goroutine (WriteAnswerDirect).
	direct bool

	// What a deferred answer needs of the request (see Defer), so that the request itself
	// is not kept while it waits.
	code      int32
	opaque    int32
	serialize protocol.SerializeType

	// deferred is set by Defer on the Handler's goroutine, before the Deferred escapes it;
	// inFlightDeferred too, by DeferInFlight: the request keeps its in-flight slot.
	deferred         bool
	inFlightDeferred bool
	// Guarded by the connection's dmu: the connection's list of deferred requests not yet
	// answered, and what to call if it closes first.
	listed       bool
	dprev, dnext *requestCtx
	onDrop       func()

	// Set by RespondWithFiles on the Handler's goroutine, read by serve on the same one once
	// the Handler returned.
	fileResp    *protocol.Command
	fileRegions []FileRegion
	fileRelease func()
}

// requestCtxKey is the context key under which a requestCtx finds itself.
type requestCtxKey struct{}

func (rc *requestCtx) Value(key any) any {
	if key == (requestCtxKey{}) {
		return rc
	}
	return rc.Context.Value(key)
}

// park moves the request from the in-flight bound (MaxInFlightPerConn) to the parked one
// (MaxParkedPerConn), for Defer: a request waiting for an event (a long-polling pull with
// nothing to return) must not fill the in-flight bound, or a consumer with a pull parked per
// queue would have its heartbeats, locks and commits on the same connection refused.
//
// park reports false, and changes nothing, when the connection already has its bound of
// parked requests, when the request has finished, and for a request served inline (see
// InlineHandler) or deferred in flight. It reports true when the request is parked, also when
// it already was.
func (rc *requestCtx) park() bool {
	if rc.inline || rc.inFlightDeferred {
		return false
	}
	switch rc.state.Load() {
	case reqParked:
		return true
	case reqFinished:
		return false
	}
	c := rc.c
	// Take a parked slot first: the request is then counted somewhere at every moment, which
	// Shutdown and the idle sweeper rely on.
	if c.parked.Add(1) > c.cfg.maxParked {
		c.parked.Add(-1)
		c.log.Debug("parked request bound reached", "max", c.cfg.maxParked)
		return false
	}
	if !rc.state.CompareAndSwap(reqInFlight, reqParked) {
		c.parked.Add(-1)
		return rc.state.Load() == reqParked
	}
	// Should the Handler finish in between, serve has taken the request off the parked
	// count already; the totals still come out right.
	c.inflight.Add(-1)
	return true
}

func (c *Conn) callHandler(ctx context.Context, req *protocol.Command) (resp *protocol.Command) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "code", req.RequestCode(), "opaque", req.Opaque, "panic", r, "stack", string(debug.Stack()))
			resp = protocol.NewResponse(req, protocol.SystemError, fmt.Sprintf("handler panic: %v", r))
		}
	}()
	if c.cfg.handler == nil {
		return protocol.NewResponse(req, protocol.RequestCodeNotSupported, fmt.Sprintf("request code %d not supported", req.Code))
	}
	return c.cfg.handler.ServeRemoting(ctx, c, req)
}

// respond writes resp as the response to req. A response that cannot be encoded (too large)
// is replaced by SYSTEM_ERROR so that the caller is not left waiting.
func (c *Conn) respond(req, resp *protocol.Command) {
	c.respondFiles(req, resp, nil, nil)
}

// respondDirect is respond writing the answer on this goroutine (after any write under way),
// not handing it to the flusher.
func (c *Conn) respondDirect(req, resp *protocol.Command) {
	fixed := *resp
	fixed.Opaque = req.Opaque
	fixed.Serialize = req.Serialize
	fixed.Flag = fixed.Flag&^protocol.FlagOneway | protocol.FlagResponse
	if _, err := c.writeFrame(&fixed, nil, nil); err != nil && !errors.Is(err, ErrConnClosed) {
		c.log.Error("cannot write response", "code", req.RequestCode(), "opaque", req.Opaque, "err", err)
	}
}

// respondFiles is respond for a response whose body is regions of files (none: resp.Body);
// release, if not nil, is called once.
func (c *Conn) respondFiles(req, resp *protocol.Command, regions []FileRegion, release func()) {
	if resp.Opaque != req.Opaque || resp.Serialize != req.Serialize ||
		resp.Flag&(protocol.FlagResponse|protocol.FlagOneway) != protocol.FlagResponse {
		// Fix a copy: the Handler may share its response value.
		fixed := *resp
		fixed.Opaque = req.Opaque
		fixed.Serialize = req.Serialize
		fixed.Flag = fixed.Flag&^protocol.FlagOneway | protocol.FlagResponse
		resp = &fixed
	}
	var err error
	if len(regions) > 0 {
		// Written before the handler's goroutine moves on: the regions pin their segments
		// until they are out, and the goroutine's wait bounds how many a connection holds.
		_, err = c.writeFrame(resp, regions, release)
	} else {
		// Queued for the flusher, not written here: the serving goroutine is free at once,
		// and the responses of many requests leave together without each waiting for the
		// write.
		err = c.queueCommand(resp)
	}
	if err == nil || errors.Is(err, ErrConnClosed) {
		return
	}
	c.log.Error("cannot encode response", "code", req.RequestCode(), "opaque", req.Opaque, "err", err)
	_ = c.queueCommand(protocol.NewResponse(req, protocol.SystemError, "response could not be encoded: "+err.Error()))
}
