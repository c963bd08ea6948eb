package protocol

import "fmt"

// BrokerError is a broker's (or name server's) refusal: a response whose code says the request
// failed, with its code and remark, so that callers can tell a full disk from a bad topic
// name. flowd's producer and consumer return it wrapped; test with errors.As.
type BrokerError struct {
	// Code is the response code, e.g. SystemBusy.
	Code ResponseCode
	// Remark is the broker's explanation, as sent.
	Remark string
}

func (e *BrokerError) Error() string {
	if e.Remark == "" {
		return fmt.Sprintf("broker answered %s (%d)", e.Code, e.Code)
	}
	return fmt.Sprintf("broker answered %s (%d): %s", e.Code, e.Code, e.Remark)
}
