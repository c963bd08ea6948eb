package consumer

import (
	"errors"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// Sentinel errors. Test for them with errors.Is; they come wrapped with what they concern.
var (
	// ErrNotRunning: the call needs a running consumer (after Start, before Close).
	ErrNotRunning = errors.New("consumer: not running")
	// ErrBadState: Start on a consumer that is not freshly created (started twice, failed to
	// start, or shut down).
	ErrBadState = errors.New("consumer: bad state for this call")
	// ErrSubscribeAndAssign: Subscribe and Assign are mutually exclusive on one consumer.
	ErrSubscribeAndAssign = errors.New("consumer: subscribe and assign are mutually exclusive")
	// ErrNotAssigned: the queue is not assigned to this consumer.
	ErrNotAssigned = errors.New("consumer: queue not assigned")
	// ErrOffsetOutOfRange: a seek outside [min offset, max offset] of the queue.
	ErrOffsetOutOfRange = errors.New("consumer: offset out of range")
	// ErrInvalidOption: an option's value is out of range; the message says which.
	ErrInvalidOption = errors.New("consumer: invalid option")
	// ErrInvalidArgument: a call's argument is invalid (empty topic, nil selector, …).
	ErrInvalidArgument = errors.New("consumer: invalid argument")
	// ErrTopicNotExist: the name servers know no such topic, or a broker answered a pull of
	// it TOPIC_NOT_EXIST.
	ErrTopicNotExist = clientcore.ErrTopicNotExist
	// ErrSubscriptionRefused: a broker cannot read with the subscription's expression
	// (SUBSCRIPTION_PARSE_FAILED: a SQL92 syntax error, an unknown expression type, a Wasm
	// filter that is not deployed or not active). Poll reports it; see Poll.
	ErrSubscriptionRefused = errors.New("consumer: subscription refused by the broker")
	// ErrGroupNotExist: a broker does not keep the consumer group and will not create it
	// (SUBSCRIPTION_GROUP_NOT_EXIST). Poll reports it; see Poll.
	ErrGroupNotExist = errors.New("consumer: consumer group does not exist on the broker")
	// ErrReadOnly: a reader (NewReader) commits nothing and sends nothing back.
	ErrReadOnly = errors.New("consumer: a reader keeps no offsets")
)

// BrokerError is a broker's refusal: its response code and remark. Test with errors.As.
type BrokerError = protocol.BrokerError
