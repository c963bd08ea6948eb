package clientcore

import "errors"

// Handle carries a core inside the public client.Client without exporting it. client.Client
// embeds a Handle under an unexported name, which gives it the unexported method below. Only
// this package can call that method, so only flowd's own packages reach the core (through
// Of), and nothing of it shows in client's API: no accessor, no package-level hook.
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

// Open returns the core a producer or consumer uses and whether it owns it, that is, closes
// it on Close. With a shared client (WithClient) it is shared's, which its creator closes;
// with options for a client of its own (WithClientOptions; opts is how many), it is that of
// the client build makes from them. Exactly one of the two must be given, so every error is
// the caller's options' fault.
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
