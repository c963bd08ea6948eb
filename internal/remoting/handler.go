package remoting

// The contract between the transport and what it serves: Handler and the optional
// interfaces through which a Handler tells the transport how its requests may be served.
// The transport's side of it is in admission.go.

import (
	"context"

	"github.com/flowd-io/flowd/protocol"
)

// Handler serves the requests that arrive on a connection.
//
// ServeRemoting returns the response to req, or nil to send none. The transport makes the
// response fit req whatever the Handler built: it carries req's opaque and serialize type and
// the response flag. A response to a oneway request is dropped.
//
// Each request is served on its own goroutine, so ServeRemoting may block (a long-polling pull
// does) without holding up other requests on the same connection; only the requests an
// InlineHandler vouches for are served on the connection's read goroutine. ctx is cancelled when the
// connection closes; a Handler that blocks must watch it, and one that waits for an event
// rather than working should call Defer(ctx) and return, answering later through the
// Deferred without holding a goroutine or an in-flight slot. req.Body is the Handler's to
// keep.
// A panic is recovered, logged, and answered SYSTEM_ERROR.
type Handler interface {
	ServeRemoting(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command
}

// InlineHandler is a Handler that can tell, request by request, that serving a request never
// blocks: it only works in memory (or appends to a page cache), with no lock held for long by
// others, no disk sync and no network call. Such a request is served on the connection's read
// goroutine, with no goroutine hand-off: a 1 KiB send costs less than the wake-up of another
// goroutine and the growth of its stack through the Handler's call chain (see RATIONALE.md).
//
// Inline is asked for every request admitted under the in-flight bound, on the read
// goroutine; it must be cheap and must not block (it looks at req's code and ExtFields and
// at state in memory). It may answer false whenever unsure: the request is then served on
// its own goroutine as usual. A request served inline is counted in flight like any other,
// a panic in it is recovered and answered SYSTEM_ERROR, and its response is queued for the
// connection's flusher as usual. Defer called by an inline request reports false: the
// Handler answers at once instead of waiting, since waiting would hold up the connection's
// reads; an inline request may still answer later through DeferInFlight. While an inline
// request is served, no other frame of its connection is read.
type InlineHandler interface {
	Handler
	Inline(req *protocol.Command) bool
}

// RawExtHandler is a Handler that reads the header fields of some requests itself, from
// protocol.Command.RawExt: for a request with a binary (ROCKETMQ) header whose code RawExt
// reports true, the transport leaves ExtFields nil and does not build its map (see
// protocol.ReadFrameRawExt). RawExt is asked on the read goroutine for every such frame and
// must be cheap. Requests with JSON headers always come with ExtFields.
type RawExtHandler interface {
	Handler
	RawExt(code protocol.RequestCode) bool
}

// LendingInlineHandler is an InlineHandler whose inline requests borrow their body: the
// Body of a request served on the read goroutine points into the connection's read buffer
// (protocol.ReadFrameLent) and is valid only until ServeRemoting returns; the Handler
// copies whatever it keeps of it, and does not answer with it. That saves a copy and an
// allocation per request (a 1 KiB send: the body was a quarter of the bytes allocated per
// message). Requests served on goroutines of their own, and responses, own their body.
type LendingInlineHandler interface {
	InlineHandler
	LendInlineBody()
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command

// ServeRemoting calls f.
func (f HandlerFunc) ServeRemoting(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command {
	return f(ctx, c, req)
}
