package clientcore

import (
	"errors"

	"github.com/flowd-io/flowd/protocol"
)

// Sentinel errors. Test for them with errors.Is; they come wrapped with the topic, group or
// address concerned.
var (
	// ErrClosed is returned by a Client's methods after Close.
	ErrClosed = errors.New("client: closed")
	// ErrNoNameServers is returned by New when no name-server address is given.
	ErrNoNameServers = errors.New("client: no name server addresses")
	// ErrTopicNotExist: the name servers answered TOPIC_NOT_EXIST for a topic.
	ErrTopicNotExist = errors.New("client: topic does not exist")
	// ErrBrokerNotFound: no route known names a master address for a broker name.
	ErrBrokerNotFound = errors.New("client: broker not found")
	// ErrGroupRegistered: a producer or consumer of the same group is already registered in
	// this Client.
	ErrGroupRegistered = errors.New("client: group already registered")
)

// BrokerError is a response whose code says the request failed; it is public, in protocol,
// because the producer and consumer return it to their users.
type BrokerError = protocol.BrokerError

// NewBrokerError returns resp's code and remark as a *BrokerError.
func NewBrokerError(resp *protocol.Command) *BrokerError {
	return &BrokerError{Code: resp.ResponseCode(), Remark: resp.Remark}
}

// IsCode reports whether err is, or wraps, a *BrokerError with the given code.
func IsCode(err error, code protocol.ResponseCode) bool {
	var be *BrokerError
	return errors.As(err, &be) && be.Code == code
}
