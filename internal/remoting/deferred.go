package remoting

// Deferred requests. A request deferred with Defer (holding a parked slot) or DeferInFlight
// (holding its in-flight slot) waits on its connection's deferred list until it is answered
// or the connection's close drops it; either takes it from reqParked (or reqInFlight) to
// reqFinished with one compare-and-swap, so only the first does anything, and that one
// gives the slot back once. The list's lock (dmu) is a leaf: answers are written, and onDrop
// called, outside it. Once the close has taken the list (dclosed), nothing more is listed.

import (
	"context"

	"github.com/flowd-io/flowd/protocol"
)

// Deferred is a request whose Handler returned without answering it: the answer is sent
// later, once, from any goroutine, with Respond or RespondFiles. Until then the request holds
// a parked slot of its connection (MaxParkedPerConn; an in-flight one with DeferInFlight)
// and keeps it from closing as idle, as a Handler still running does, but no goroutine: a
// long-polling pull waiting for a message is then a few hundred bytes held by whatever will
// wake it, not a goroutine and its stack.
//
// The zero Deferred is no request: Respond and RespondFiles do nothing and report false.
// A Deferred is a small value; copies refer to the same request.
type Deferred struct{ rc *requestCtx }

// Defer tells the transport that the Handler serving ctx (a Handler's context, or one derived
// from it) will answer later, through the returned Deferred, rather than by returning the
// answer. The Handler then returns; whatever it returns after a successful Defer is sent
// through the Deferred too (so a panic's SYSTEM_ERROR still answers), and a nil return sends
// nothing.
//
// onDrop, if not nil, is called once if the connection closes before the request was
// answered, on the connection's read goroutine, after which Respond reports false: it lets
// the owner forget the request. It must not block.
//
// Defer reports false, and changes nothing, when the request cannot wait: the connection has
// its bound of parked requests (MaxParkedPerConn), the request is served inline or is
// oneway, it has already been deferred or has finished, the connection has closed, or ctx is
// not a Handler's context of this package (a test calling the Handler directly). The Handler
// should then answer at once by returning.
func Defer(ctx context.Context, onDrop func()) (Deferred, bool) {
	rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	if !ok || rc.oneway || rc.deferred || !rc.park() {
		return Deferred{}, false
	}
	// Parked from here on: if the Handler returns without deferring after all, serve gives
	// the parked slot back as for any parked request.
	if !rc.c.listDeferred(rc, onDrop, false) {
		return Deferred{}, false
	}
	return Deferred{rc}, true
}

// DeferInFlight is Defer for a request whose answer waits for work already under way and
// bounded in time, such as a send waiting for the fsync that covers its message (the
// store's group commit answers it), rather than for an event that may never come. Unlike
// Defer:
//
//   - the request stays counted against the connection's in-flight bound
//     (MaxInFlightPerConn), not the parked one, until it is answered: a peer that keeps
//     more requests waiting than the bound is refused SYSTEM_BUSY, as it would be with
//     its Handlers blocked, so the answers waiting per connection stay bounded;
//   - a request served inline (see InlineHandler) may be deferred: its Handler returns at
//     once and the read goroutine goes on with the next request while this one waits.
//     A Handler that lends its inline bodies (LendingInlineHandler) must be done with the
//     body before it returns, as always.
//
// Otherwise it is Defer: onDrop, Respond, RespondFiles and the close of the connection
// work alike, and it reports false for a oneway request, one already deferred or finished,
// a closed connection, or a context that does not come from this package. Defer on a request
// deferred this way reports false.
func DeferInFlight(ctx context.Context, onDrop func()) (Deferred, bool) {
	rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	if !ok || rc.oneway || rc.deferred || rc.state.Load() != reqInFlight {
		return Deferred{}, false
	}
	if !rc.c.listDeferred(rc, onDrop, true) {
		return Deferred{}, false
	}
	return Deferred{rc}, true
}

// listDeferred puts rc on the connection's list of deferred requests, which its close
// drops, and marks it deferred, holding its in-flight slot (inFlight) or its parked one.
// It reports false once the connection has closed.
func (c *Conn) listDeferred(rc *requestCtx, onDrop func(), inFlight bool) bool {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.dclosed {
		return false
	}
	rc.onDrop = onDrop
	rc.listed = true
	rc.dnext = c.dhead
	if c.dhead != nil {
		c.dhead.dprev = rc
	}
	c.dhead = rc
	rc.inFlightDeferred = inFlight
	rc.deferred = true
	return true
}

// Context is the context of the deferred request: its connection's, cancelled when the
// connection closes; RespondWithFiles does not apply to it (use RespondFiles). The zero
// Deferred's is context.Background().
func (d Deferred) Context() context.Context {
	if d.rc == nil {
		return context.Background()
	}
	return d.rc
}

// Respond sends resp as the answer to the deferred request and frees its parked (or, with
// DeferInFlight, in-flight) slot. The transport makes resp fit the request (opaque,
// serialize type, response flag) as for a returned response; a nil resp sends nothing.
// Only the first Respond or RespondFiles of a request, made before its connection closed,
// reports true; later ones, and any after the close, do nothing. Like a returned response,
// resp is queued for the connection's writer and Respond does not wait for the write, nor
// for a peer that does not read: the answers a connection holds are bounded by its
// in-flight and parked bounds, and its write timeout closes it.
func (d Deferred) Respond(resp *protocol.Command) bool {
	return d.RespondFiles(resp, nil, nil)
}

// RespondFiles is Respond for a response whose body is regions of files (see
// RespondWithFiles, whose rules apply). release, if not nil, is called exactly once, also
// when the answer is not sent (the request was answered already, or its connection closed).
// Unlike Respond, it returns once the frame is written (or failed), on the caller's
// goroutine: the regions pin their files until then.
func (d Deferred) RespondFiles(resp *protocol.Command, regions []FileRegion, release func()) bool {
	rc := d.rc
	if rc == nil || !rc.finishDeferred() {
		if release != nil {
			release()
		}
		return false
	}
	c := rc.c
	c.unlistDeferred(rc)
	if resp == nil {
		if release != nil {
			release()
		}
		rc.releaseSlot()
		c.activity.Add(1)
		return true
	}
	// Counted as responding before it stops counting as parked (or in flight), so that
	// Shutdown and the idle sweeper always see it in one or the other (as serve does).
	c.responding.Add(1)
	rc.releaseSlot()
	req := protocol.Command{Code: rc.code, Opaque: rc.opaque, Serialize: rc.serialize}
	if len(regions) > 0 && len(resp.Body) == 0 {
		c.respondFiles(&req, resp, regions, release)
	} else {
		if release != nil {
			release()
		}
		c.respond(&req, resp)
	}
	c.responding.Add(-1)
	c.activity.Add(1)
	return true
}

// finishDeferred marks a deferred request answered (or dropped); only the first call
// reports true.
func (rc *requestCtx) finishDeferred() bool {
	from := reqParked
	if rc.inFlightDeferred {
		from = reqInFlight
	}
	return rc.state.CompareAndSwap(from, reqFinished)
}

// releaseSlot gives back the slot a finished deferred request held.
func (rc *requestCtx) releaseSlot() {
	if rc.inFlightDeferred {
		rc.c.inflight.Add(-1)
	} else {
		rc.c.parked.Add(-1)
	}
}

// unlistDeferred takes an answered request off the connection's deferred list.
func (c *Conn) unlistDeferred(rc *requestCtx) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	rc.onDrop = nil
	if !rc.listed {
		return // the close took the list
	}
	rc.listed = false
	if rc.dprev != nil {
		rc.dprev.dnext = rc.dnext
	} else {
		c.dhead = rc.dnext
	}
	if rc.dnext != nil {
		rc.dnext.dprev = rc.dprev
	}
	rc.dprev, rc.dnext = nil, nil
}

// dropDeferred, once the connection has closed, frees the slots of the deferred requests
// not yet answered and tells their owners (onDrop). Called by run; Defer refuses afterwards.
func (c *Conn) dropDeferred() {
	var dropped []*requestCtx
	c.dmu.Lock()
	c.dclosed = true
	for rc := c.dhead; rc != nil; {
		next := rc.dnext
		rc.listed = false
		rc.dprev, rc.dnext = nil, nil
		if rc.finishDeferred() {
			dropped = append(dropped, rc)
		}
		rc = next
	}
	c.dhead = nil
	c.dmu.Unlock()
	for _, rc := range dropped {
		rc.releaseSlot()
		if rc.onDrop != nil {
			rc.onDrop()
		}
		rc.onDrop = nil
	}
}

// ServedInline reports whether the Handler serving ctx runs on its connection's read
// goroutine (InlineHandler), where it must not wait: a handler that may wait for an event
// answers at once instead.
func ServedInline(ctx context.Context) bool {
	rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	return ok && rc.inline
}

// WriteAnswerDirect asks that the answer of the Handler serving ctx be written by the serving
// goroutine itself once the Handler returns, rather than queued for the connection's flusher:
// for a large answer its peer waits for (a pop's batch), one goroutine wake-up less. The
// serving goroutine then waits for the write, which on the read goroutine (InlineHandler)
// holds up the connection's next requests until the socket takes it.
func WriteAnswerDirect(ctx context.Context) {
	if rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx); ok {
		rc.direct = true
	}
}
