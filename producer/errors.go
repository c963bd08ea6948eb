package producer

import (
	"errors"

	"github.com/flowd-io/flowd/protocol"
)

// Sentinel errors. Test for them with errors.Is; they come wrapped with the topic and cause.
var (
	// ErrNotStarted: a send on a producer that was not started.
	ErrNotStarted = errors.New("producer: not started")
	// ErrClosed: a send on a producer after Close.
	ErrClosed = errors.New("producer: closed")
	// ErrBadState: Start on a producer that was already started or closed.
	ErrBadState = errors.New("producer: bad state for this call")
	// ErrMessageTooLarge: the body (or the encoded batch) exceeds the maximum message size;
	// refused before anything is sent.
	ErrMessageTooLarge = errors.New("producer: message too large")
	// ErrInvalidMessage: no topic, an over-long topic, an empty body, a batch mixing topics, …
	ErrInvalidMessage = errors.New("producer: invalid message")
	// ErrNoRoute: neither the topic nor the auto-create key has a route with a writable queue.
	ErrNoRoute = errors.New("producer: no route to topic")
	// ErrInvalidOption: an option's value is out of range; the message says which.
	ErrInvalidOption = errors.New("producer: invalid option")
)

// BrokerError is a broker's refusal of a send: its response code and remark. Test with
// errors.As.
type BrokerError = protocol.BrokerError
