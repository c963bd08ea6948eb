package remoting

import (
	"errors"
	"fmt"
)

// Sentinel errors. Test for them with errors.Is: ErrConnClosed and ErrClientClosed come
// wrapped with the address and the operation.
var (
	// ErrServerClosed is returned by Serve and ListenAndServe after Shutdown or Close.
	ErrServerClosed = errors.New("remoting: server closed")
	// ErrConnClosed is wrapped by every error that comes from a connection having closed: the
	// calls pending on it, and calls made on it afterwards. The wrapping error names the
	// remote address and wraps the cause too (io.EOF when the peer hung up,
	// protocol.ErrMalformedFrame for a broken frame, and so on).
	ErrConnClosed = errors.New("remoting: connection closed")
	// ErrClientClosed is returned by a Client's methods after Close.
	ErrClientClosed = errors.New("remoting: client closed")
)

// Causes of a connection closing that the package itself decides. They are unexported: callers
// test for ErrConnClosed, and these only make the message say why.
var (
	errClosedLocally  = errors.New("closed locally")
	errIdle           = errors.New("idle timeout")
	errFrameStalled   = errors.New("frame read timeout: the peer stalled mid-frame")
	errServerShutdown = errors.New("server shutting down")
)

// connClosedError is what a closed Conn's Err returns: it wraps both ErrConnClosed and the
// cause, and names the peer.
type connClosedError struct {
	addr  string
	cause error
}

func (e *connClosedError) Error() string {
	return fmt.Sprintf("remoting: connection to %s closed: %v", e.addr, e.cause)
}

func (e *connClosedError) Unwrap() []error { return []error{ErrConnClosed, e.cause} }
