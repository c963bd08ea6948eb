package pop

import (
	"errors"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// Sentinel errors. Test for them with errors.Is; they come wrapped with what they concern.
var (
	// ErrInvalidOption: an option's value is out of range; the message says which.
	ErrInvalidOption = errors.New("pop: invalid option")
	// ErrInvalidArgument: a call's argument is invalid (a batch size outside 1..MaxBatch,
	// a message that was not received, …).
	ErrInvalidArgument = errors.New("pop: invalid argument")
	// ErrClosed: the consumer was closed.
	ErrClosed = errors.New("pop: consumer closed")
	// ErrTopicNotExist: the name servers or a broker know no such topic.
	ErrTopicNotExist = clientcore.ErrTopicNotExist
	// ErrNotInFlight: the broker does not have the message in flight under this receipt:
	// it was acknowledged already, or its invisibility passed (it will be received again, or
	// was, with a new receipt), or its invisibility was changed since (NO_MESSAGE).
	ErrNotInFlight = errors.New("pop: message not in flight under this receipt")
)

// BrokerError is a broker's refusal: its response code and remark. Test with errors.As.
type BrokerError = protocol.BrokerError
