// Package client is flowd's client core, shared by the producers and consumers of a process:
// what RocketMQ calls the MQClientInstance and franz-go a kgo.Client. A Client holds one
// connection per broker and name server, the cache of topic routes, and the heartbeats that
// keep its producer and consumer groups known to every broker; it answers the requests
// brokers send to clients (membership changes, transaction check-backs, replies, offset
// resets, running info).
//
// Every producer and consumer needs one. Either it builds its own from options, and closes it
// on Close:
//
//	p, err := producer.New("orders", producer.WithClientOptions(client.WithNameServers("127.0.0.1:9876")))
//
// or it is handed one to share, which its creator closes once every producer and consumer
// using it is closed:
//
//	cl, err := client.New(client.WithNameServers("127.0.0.1:9876"), client.WithLogger(log))
//	if err != nil { … }
//	defer cl.Close(context.Background())
//	p, err := producer.New("orders", producer.WithClient(cl))
//	c, err := consumer.NewLitePull("billing", consumer.WithClient(cl))
//
// A shared Client gives the producer and consumers one client id (so one heartbeat names all
// their groups) and one connection per broker. Two consumers of the same group need two
// Clients: a Client registers a group once.
//
// # Notes
//
// Unlike RocketMQ's clients, a Client is not a process-wide singleton keyed by its instance
// name: there is no package-level state, and producers and consumers share a Client only when
// handed one. So two consumers of one process are two members of their group unless told
// otherwise, which RocketMQ achieves only with distinct instance names.
package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/flowd-io/flowd/internal/clientcore"
)

// Sentinel errors. Test for them with errors.Is; they come wrapped with what they concern.
var (
	// ErrInvalidOption: an option's value is out of range, or a required one is missing; the
	// message says which.
	ErrInvalidOption = errors.New("client: invalid option")
	// ErrGroupRegistered: a producer or consumer started on a Client that already has one of
	// the same group (Start fails with it). A Client is one member of each of its groups.
	ErrGroupRegistered = clientcore.ErrGroupRegistered
)

// core is the unexported name under which Client embeds the core's handle: embedded, its
// unexported method lets flowd's producer and consumer reach the core (clientcore.Of); under
// an unexported name, neither the field nor anything of the core is part of Client's API.
type core = clientcore.Handle

// Client is a client core. Create it with New; producers and consumers handed it
// (producer.WithClient, consumer.WithClient) start it. Close it after all of them are
// closed. It is safe for concurrent use.
type Client struct {
	core
}

// New returns a Client built from opts; WithNameServers is required. Nothing is dialed and no
// timer runs until a producer or consumer using it starts.
func New(opts ...Option) (*Client, error) {
	var s settings
	for _, o := range opts {
		if err := o(&s); err != nil {
			return nil, err
		}
	}
	c, err := clientcore.New(s.core)
	if errors.Is(err, clientcore.ErrNoNameServers) {
		return nil, fmt.Errorf("%w: WithNameServers is required (no name-server address given)", ErrInvalidOption)
	}
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return &Client{core: clientcore.NewHandle(c)}, nil
}

// ID is the client id brokers know the Client by, "ip@instance" (WithClientIP,
// WithInstanceName). Every producer and consumer using the Client has this id.
func (c *Client) ID() string { return clientcore.Of(c).ID() }

// Close unregisters the groups still registered (producers and consumers unregister their
// own when they close), stops the heartbeats and route refreshes, and closes every
// connection. ctx bounds the unregistrations, whose failures are returned; the Client is
// closed regardless. Closing a closed Client does nothing.
func (c *Client) Close(ctx context.Context) error {
	return clientcore.Of(c).Close(ctx)
}
