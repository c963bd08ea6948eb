package clientcore

import "errors"

// Handle carries a core inside the public client.Client without exporting it. client.Client
// embeds a Handle under an unexported name, which gives it the unexported method below: only
// this package can call it, so only flowd's producer and consumer (through Of) reach the
// core, and nothing of it shows in the public API.
type Handle struct{ core *Client }

// NewHandle wraps c for client.Client.
func NewHandle(c *Client) Handle { return Handle{core: c} }

func (h Handle) clientCore() *Client { return h.core }

// carrier is a type that embeds a Handle: client.Client.
type carrier interface{ clientCore() *Client }

// Of returns the core c carries.
func Of(c carrier) *Client { return c.clientCore() }

// Errors of Open, which a producer or consumer wraps with its own ErrInvalidOption.
var (
	errNoClient   = errors.New("WithClient (with a non-nil client) or WithClientOptions(client.WithNameServers(…)) is required")
	errBothClient = errors.New("WithClient and WithClientOptions exclude each other: a shared client keeps the options it was built with")
)

// Open returns the core a producer or consumer uses, and whether it owns it (and closes it
// on Close): shared's, given with WithClient, which its creator closes; or else, given
// options for one (WithClientOptions, opts of them), that of the client build makes. It
// needs exactly one of the two. Every error is the caller's options' fault.
func Open[C interface {
	*T
	carrier
}, T any](shared C, opts int, build func() (C, error)) (cl *Client, owned bool, err error) {
	switch {
	case shared != nil && opts > 0:
		return nil, false, errBothClient
	case shared != nil:
		return Of(shared), false, nil
	case opts == 0:
		return nil, false, errNoClient
	}
	built, err := build()
	if err != nil {
		return nil, false, err
	}
	return Of(built), true, nil
}
