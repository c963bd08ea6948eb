package remoting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// ClientOptions configures Dial and Client. The zero value is ready to use: a zero field takes
// the default its comment gives.
type ClientOptions struct {
	// Handler serves the requests the server sends on the connection (RocketMQ brokers send
	// NOTIFY_CONSUMER_IDS_CHANGED oneway and GET_CONSUMER_RUNNING_INFO expecting a response).
	// Default: nil, which answers every request REQUEST_CODE_NOT_SUPPORTED.
	Handler Handler

	// MaxFrameSize is the largest frame accepted from the server, length prefix excluded.
	// Default (and upper limit): protocol.MaxFrameSize, 16 MiB.
	MaxFrameSize int

	// MaxInFlightPerConn bounds the server's requests served at once on one connection; see
	// ServerOptions.MaxInFlightPerConn.
	// Default: 256.
	MaxInFlightPerConn int

	// Serialize is the header encoding of the requests sent. Responses always come back in
	// the encoding of their request.
	// Default: protocol.JSON (the zero value), what RocketMQ's Go client sends.
	Serialize protocol.SerializeType

	// DialTimeout bounds connecting, on top of the caller's context.
	// Default: 3 s, RocketMQ's connect timeout. Negative: none.
	DialTimeout time.Duration

	// WriteTimeout bounds each write to a connection; a server that stops reading for this
	// long is disconnected.
	// Default: 10 s. Negative: none.
	WriteTimeout time.Duration

	// Logger receives connection events; see ServerOptions.Logger.
	// Default: slog.Default().
	Logger *slog.Logger

	// OnConnClose, if set, is called once per connection after it has closed and every
	// Handler call on it has returned, on the connection's read goroutine.
	OnConnClose func(*Conn)
}

func (o *ClientOptions) connConfig() (*connConfig, error) {
	if o.Serialize != protocol.JSON && o.Serialize != protocol.RocketMQ {
		return nil, fmt.Errorf("%w %d", protocol.ErrUnknownSerialize, o.Serialize)
	}
	cfg := &connConfig{
		handler:      o.Handler,
		maxFrame:     frameLimit(o.MaxFrameSize),
		maxInFlight:  inFlightLimit(o.MaxInFlightPerConn),
		maxParked:    DefaultMaxParkedPerConn,
		writeTimeout: orDefault(o.WriteTimeout, DefaultWriteTimeout),
		epoch:        time.Now(),
		logger:       o.Logger,
		serialize:    o.Serialize,
		onClose:      o.OnConnClose,
	}
	cfg.inline, _ = o.Handler.(InlineHandler)
	_, cfg.lend = o.Handler.(LendingInlineHandler)
	if rh, ok := o.Handler.(RawExtHandler); ok {
		cfg.rawExt = rh.RawExt
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	return cfg, nil
}

func (o *ClientOptions) dialer() *net.Dialer {
	d := &net.Dialer{Timeout: orDefault(o.DialTimeout, DefaultDialTimeout)}
	if d.Timeout < 0 {
		d.Timeout = 0
	}
	return d
}

// Dial connects to the remoting server at addr and returns the open connection; it serves
// the server's requests with opts.Handler until closed. ctx bounds the connecting only.
func Dial(ctx context.Context, addr string, opts ClientOptions) (*Conn, error) {
	cfg, err := opts.connConfig()
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	nc, err := opts.dialer().DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := newConn(nc, cfg)
	go c.run()
	return c, nil
}

// Client keeps one connection per server address, dialing on first use and again after the
// connection dies. It is safe for concurrent use.
//
// # Notes
//
//   - Concurrent callers for the same address share one dial, which runs on its own
//     goroutine bounded by DialTimeout and Close; each caller waits for it only as long as
//     its own context allows. A failed dial is not cached: the next call dials again.
//   - A call whose connection turns out to be already closed before anything was written is
//     retried once on a fresh connection, which is safe for any request. A call that failed
//     after its request may have been written is not retried: only the caller knows whether
//     the request is idempotent.
type Client struct {
	opts   ClientOptions
	cfg    *connConfig
	cfgErr error
	ctx    context.Context // cancelled by Close: ends dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup // dial and connection goroutines

	mu     sync.Mutex
	conns  map[string]*dialEntry
	closed bool
}

// dialEntry is one address's connection: being dialed until done is closed, then conn or err.
type dialEntry struct {
	done chan struct{}
	conn *Conn // set under Client.mu before done is closed
	err  error // set before done is closed
}

// NewClient returns a Client; it dials nothing until used.
func NewClient(opts ClientOptions) *Client {
	cl := &Client{opts: opts, conns: make(map[string]*dialEntry)}
	cl.ctx, cl.cancel = context.WithCancel(context.Background())
	cl.cfg, cl.cfgErr = opts.connConfig()
	if cl.cfg != nil {
		user := opts.OnConnClose
		cl.cfg.onClose = func(c *Conn) {
			cl.forgetConn(c)
			if user != nil {
				user(c)
			}
		}
	}
	return cl
}

// Conn returns the open connection to addr, dialing it if there is none.
func (cl *Client) Conn(ctx context.Context, addr string) (*Conn, error) {
	if cl.cfgErr != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, cl.cfgErr)
	}
	for attempt := 0; ; attempt++ {
		cl.mu.Lock()
		if cl.closed {
			cl.mu.Unlock()
			return nil, fmt.Errorf("dial %s: %w", addr, ErrClientClosed)
		}
		e := cl.conns[addr]
		if e == nil {
			e = &dialEntry{done: make(chan struct{})}
			cl.conns[addr] = e
			cl.wg.Add(1)
			go cl.dial(addr, e)
		}
		cl.mu.Unlock()

		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("dial %s: %w", addr, ctx.Err())
		}
		if e.err != nil {
			return nil, e.err
		}
		err := e.conn.Err()
		if err == nil {
			return e.conn, nil
		}
		// Dead, and its read goroutine has not forgotten it yet: forget it here and dial
		// again, once; a server that closes every connection at once must not make this spin.
		cl.forget(addr, e)
		if attempt > 0 {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
	}
}

func (cl *Client) dial(addr string, e *dialEntry) {
	defer cl.wg.Done()
	defer close(e.done)
	nc, err := cl.opts.dialer().DialContext(cl.ctx, "tcp", addr)
	if err != nil {
		if cl.ctx.Err() != nil {
			err = ErrClientClosed
		}
		e.err = fmt.Errorf("dial %s: %w", addr, err)
		cl.forget(addr, e)
		return
	}
	c := newConn(nc, cl.cfg)
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		_ = nc.Close()
		e.err = fmt.Errorf("dial %s: %w", addr, ErrClientClosed)
		return
	}
	e.conn = c
	cl.wg.Add(1) // this goroutine's own count keeps the group above zero
	cl.mu.Unlock()
	go func() {
		defer cl.wg.Done()
		c.run()
	}()
}

// forget drops e if it is still addr's entry.
func (cl *Client) forget(addr string, e *dialEntry) {
	cl.mu.Lock()
	if cl.conns[addr] == e {
		delete(cl.conns, addr)
	}
	cl.mu.Unlock()
}

// forgetConn drops the entry holding c, once c has closed.
func (cl *Client) forgetConn(c *Conn) {
	cl.mu.Lock()
	for addr, e := range cl.conns {
		if e.conn == c {
			delete(cl.conns, addr)
			break
		}
	}
	cl.mu.Unlock()
}

// Invoke sends req to addr and waits for the response; see Conn.Invoke.
func (cl *Client) Invoke(ctx context.Context, addr string, req *protocol.Command) (*protocol.Command, error) {
	for attempt := 0; ; attempt++ {
		c, err := cl.Conn(ctx, addr)
		if err != nil {
			return nil, err
		}
		resp, sent, err := c.invoke(ctx, req)
		if err != nil && !sent && attempt == 0 && errors.Is(err, ErrConnClosed) {
			continue
		}
		return resp, err
	}
}

// InvokeOneway sends req to addr with the oneway flag; see Conn.InvokeOneway.
func (cl *Client) InvokeOneway(ctx context.Context, addr string, req *protocol.Command) error {
	for attempt := 0; ; attempt++ {
		c, err := cl.Conn(ctx, addr)
		if err != nil {
			return err
		}
		sent, err := c.invokeOneway(ctx, req)
		if err != nil && !sent && attempt == 0 && errors.Is(err, ErrConnClosed) {
			continue
		}
		return err
	}
}

// Close closes every connection, failing their pending calls, and waits for their read
// goroutines and Handler calls to finish. It must not be called from a Handler of this Client.
func (cl *Client) Close() error {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		return nil
	}
	cl.closed = true
	var conns []*Conn
	for _, e := range cl.conns {
		if e.conn != nil {
			conns = append(conns, e.conn)
		}
	}
	cl.mu.Unlock()
	cl.cancel()
	for _, c := range conns {
		c.closeWithErr(ErrClientClosed)
	}
	cl.wg.Wait()
	return nil
}
