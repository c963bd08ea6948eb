package remoting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// ServerOptions configures a Server. The zero value is ready to use: a zero field takes the
// default its comment gives.
type ServerOptions struct {
	// MaxFrameSize is the largest frame accepted, length prefix excluded. A peer that
	// announces a larger one is disconnected before anything is allocated for it.
	// Default (and upper limit): protocol.MaxFrameSize, 16 MiB.
	MaxFrameSize int

	// MaxInFlightPerConn bounds the requests served at once on one connection. A request
	// beyond it is answered SYSTEM_BUSY ("too many requests in flight on this connection")
	// at once, without running the Handler; a oneway request beyond it is dropped and
	// logged. A request whose Handler deferred it (Defer) counts against MaxParkedPerConn
	// instead until it is answered.
	// Default: 256.
	MaxInFlightPerConn int

	// MaxParkedPerConn bounds the requests parked at once on one connection (see Defer): the
	// long-polling pulls of a consumer, one per queue it reads from this server. Defer reports
	// false beyond it, and the Handler answers at once instead of waiting.
	// Default: 4096.
	MaxParkedPerConn int

	// MaxConns caps the connections open at once. A connection accepted beyond it is closed
	// at once, with a Warn log line; the others are not affected.
	// Default: 10000. Negative: no cap.
	MaxConns int

	// FrameReadTimeout bounds how long one frame may take to arrive, from its first byte to
	// its last. A connection stalled mid-frame is closed between FrameReadTimeout and
	// FrameReadTimeout + FrameReadTimeout/4 after its frame began, so that a peer cannot hold
	// a partly received frame (and its buffer) for ever. The time between frames is the idle
	// timeout's business, not this one's. At the default, a 16 MiB frame must arrive at about
	// 560 KB/s.
	// Default: 30 s. Negative: none.
	FrameReadTimeout time.Duration

	// IdleTimeout closes a connection on which nothing has happened for this long: no frame
	// received, no request being served, no call waiting for its response. It is closed
	// between IdleTimeout and IdleTimeout + IdleTimeout/4 after its last activity. RocketMQ clients heartbeat every
	// 30 s, so the default only closes connections whose client is gone without a FIN.
	// Default: 120 s. Negative: never.
	IdleTimeout time.Duration

	// WriteTimeout bounds each write to a connection. A peer that stops reading for this long
	// is disconnected rather than allowed to hold its handlers' responses in memory.
	// Default: 10 s. Negative: none.
	WriteTimeout time.Duration

	// SendfileThreshold is the smallest region of a file body (RespondWithFiles) sent with
	// sendfile(2); shorter regions are copied into the connection's write buffer, which
	// costs less than a system call each. It applies on Linux, to TCP connections, for files
	// that expose a descriptor; everything else is copied.
	// Default: DefaultSendfileThreshold (16 KiB). Negative: always copy.
	SendfileThreshold int64

	// Logger receives connection events: broken frames, unreadable headers, stalled frames and
	// refused connections (Warn), idle closes (Info), lost connections (Debug), handler
	// panics (Error), refused requests (Debug).
	// Default: slog.Default().
	Logger *slog.Logger

	// OnConnOpen, if set, is called on each accepted connection before its first frame is
	// read, on the connection's read goroutine.
	OnConnOpen func(*Conn)

	// OnConnClose, if set, is called once per connection after it has closed and every
	// Handler call on it has returned, on the connection's read goroutine. The broker's
	// consumer manager takes a closed connection as its client leaving.
	OnConnClose func(*Conn)
}

// Server accepts remoting connections and serves their requests with a Handler.
//
// # Notes
//
//   - One read goroutine per connection, plus one goroutine per request being served on a
//     goroutine of its own (up to 16 kept waiting for the next), a flusher while the
//     connection has frames to write, and one sweeper per Server. The sweeper looks at every connection each IdleTimeout/8 (or
//     FrameReadTimeout/8, if shorter) for idle connections and stalled frames instead of
//     arming a read deadline per frame: a frame that arrives whole in one read costs one
//     atomic increment, and one that does not, two more atomic stores.
//   - A frame's buffer grows as its bytes arrive (protocol.ReadFrame): a peer that announces
//     16 MiB and sends little holds little.
//   - A frame that arrives whole but whose header cannot be read is answered
//     INVALID_PARAMETER when its opaque could be read, and the connection goes on; only a
//     broken frame (a length prefix out of range, a header length beyond the frame) closes it.
type Server struct {
	cfg          connConfig
	idleTimeout  time.Duration
	frameTimeout time.Duration
	maxConns     int
	userClose    func(*Conn)

	draining atomic.Bool   // set once, by Shutdown or Close
	stop     chan struct{} // closed with draining: stops the sweeper and accept back-off
	sweepers sync.WaitGroup

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*Conn]struct{}
	addr      net.Addr
	sweeping  bool
}

// NewServer returns a Server that serves requests with h. A nil h answers every request
// REQUEST_CODE_NOT_SUPPORTED.
func NewServer(h Handler, opts ServerOptions) *Server {
	s := &Server{
		idleTimeout: opts.IdleTimeout,
		userClose:   opts.OnConnClose,
		stop:        make(chan struct{}),
		listeners:   make(map[net.Listener]struct{}),
		conns:       make(map[*Conn]struct{}),
	}
	if s.idleTimeout == 0 {
		s.idleTimeout = DefaultIdleTimeout
	}
	s.frameTimeout = orDefault(opts.FrameReadTimeout, DefaultFrameReadTimeout)
	s.maxConns = opts.MaxConns
	if s.maxConns == 0 {
		s.maxConns = DefaultMaxConns
	}
	maxParked := int32(DefaultMaxParkedPerConn)
	if opts.MaxParkedPerConn > 0 {
		maxParked = int32(min(opts.MaxParkedPerConn, 1<<30))
	}
	s.cfg = connConfig{
		handler:      h,
		maxFrame:     frameLimit(opts.MaxFrameSize),
		maxInFlight:  inFlightLimit(opts.MaxInFlightPerConn),
		maxParked:    maxParked,
		epoch:        time.Now(),
		writeTimeout: orDefault(opts.WriteTimeout, DefaultWriteTimeout),
		logger:       opts.Logger,
		serialize:    protocol.JSON,
		mirrorPeer:   true,
		draining:     &s.draining,
		onOpen:       opts.OnConnOpen,
		onClose:      s.connClosed,
		sendfileMin:  DefaultSendfileThreshold,
	}
	s.cfg.inline, _ = h.(InlineHandler)
	_, s.cfg.lend = h.(LendingInlineHandler)
	if rh, ok := h.(RawExtHandler); ok {
		s.cfg.rawExt = rh.RawExt
	}
	if opts.SendfileThreshold != 0 {
		s.cfg.sendfileMin = max(opts.SendfileThreshold, -1)
	}
	if s.cfg.logger == nil {
		s.cfg.logger = slog.Default()
	}
	return s
}

func frameLimit(n int) int {
	if n <= 0 || n > protocol.MaxFrameSize {
		return protocol.MaxFrameSize
	}
	return n
}

func inFlightLimit(n int) int32 {
	if n <= 0 {
		return DefaultMaxInFlightPerConn
	}
	return int32(min(n, 1<<30))
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// ListenAndServe listens on the TCP address addr and serves it; see Serve.
func (s *Server) ListenAndServe(addr string) error {
	if s.draining.Load() {
		return ErrServerClosed
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	return s.Serve(ln)
}

// Addr is the address of the first listener Serve was given, or nil before that.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Serve accepts connections on ln until Shutdown or Close, then returns ErrServerClosed. Any
// other accept error that is not temporary ends it too, wrapped. Serve closes ln when it
// returns. It may be called for several listeners at once.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		_ = ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	if s.addr == nil {
		s.addr = ln.Addr()
	}
	if !s.sweeping && (s.idleTimeout > 0 || s.frameTimeout > 0) {
		s.sweeping = true
		s.sweepers.Add(1)
		go s.sweep()
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		_ = ln.Close()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.draining.Load() {
				return ErrServerClosed
			}
			if !temporary(err) {
				return fmt.Errorf("accept on %s: %w", ln.Addr(), err)
			}
			// Out of file descriptors and the like: wait for some to be released rather
			// than spin, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.cfg.logger.Warn("accept failed; retrying", "addr", ln.Addr(), "err", err, "in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.stop:
				t.Stop()
			}
			continue
		}
		backoff = 0
		s.startConn(nc)
	}
}

func temporary(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true
	}
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM) ||
		errors.Is(err, syscall.ECONNABORTED)
}

func (s *Server) startConn(nc net.Conn) {
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		_ = nc.Close()
		return
	}
	if s.maxConns > 0 && len(s.conns) >= s.maxConns {
		s.mu.Unlock()
		s.cfg.logger.Warn("refusing connection: too many open", "remote", nc.RemoteAddr().String(), "max", s.maxConns)
		_ = nc.Close()
		return
	}
	c := newConn(nc, &s.cfg)
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	go c.run()
}

// ConnCount returns the number of open connections, for metrics.
func (s *Server) ConnCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// connClosed is the Conns' close callback: the user's, then forgetting the Conn, so that
// Shutdown returns only after every OnConnClose has run.
func (s *Server) connClosed(c *Conn) {
	if s.userClose != nil {
		s.userClose(c)
	}
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Shutdown stops the server gracefully. It closes the listeners, so new connections are
// refused and Serve returns ErrServerClosed; requests that arrive afterwards on open
// connections are answered SYSTEM_BUSY ("server is shutting down"); each connection is closed
// once the requests it was serving have finished and their responses are written. Shutdown
// returns when every connection is closed and its OnConnClose has run.
//
// If ctx ends first, Shutdown closes the remaining connections at once, which cancels their
// Handlers' contexts, and returns ctx's error; Handlers that ignore their context may still be
// running then.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.beginShutdown()
	// Poll, as net/http does: the connections' states change on their own goroutines, and a
	// few wake-ups per shutdown cost less than a notification on every request.
	wait := time.Millisecond
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		if s.closeDrained() == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			s.closeAll(errServerShutdown)
			return fmt.Errorf("remoting: shutdown: %w", ctx.Err())
		case <-t.C:
			wait = min(2*wait, 50*time.Millisecond)
			t.Reset(wait)
		}
	}
}

// Close stops the server now: it closes the listeners and every connection. Pending calls
// fail and Handler contexts are cancelled. Close does not wait for Handlers to return.
func (s *Server) Close() error {
	err := s.beginShutdown()
	s.closeAll(errClosedLocally)
	return err
}

func (s *Server) beginShutdown() error {
	s.mu.Lock()
	first := !s.draining.Swap(true)
	var err error
	for ln := range s.listeners {
		if cerr := ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) {
			err = errors.Join(err, fmt.Errorf("close listener %s: %w", ln.Addr(), cerr))
		}
	}
	s.mu.Unlock()
	if first {
		close(s.stop)
	}
	s.sweepers.Wait()
	return err
}

// snapshot returns the open connections, to act on outside s.mu.
func (s *Server) snapshot(dst []*Conn) []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		dst = append(dst, c)
	}
	return dst
}

// closeDrained closes the connections with nothing in flight and returns how many are left
// (closing ones included, until their OnConnClose has run).
func (s *Server) closeDrained() int {
	for _, c := range s.snapshot(nil) {
		if c.idle() {
			c.closeBetweenFrames(errServerShutdown)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *Server) closeAll(cause error) {
	for _, c := range s.snapshot(nil) {
		c.closeWithErr(cause)
	}
}

// sweep closes idle connections and connections stalled mid-frame until the server stops.
func (s *Server) sweep() {
	defer s.sweepers.Done()
	period := time.Duration(math.MaxInt64)
	if s.idleTimeout > 0 {
		period = s.idleTimeout / 8
	}
	if s.frameTimeout > 0 {
		period = min(period, s.frameTimeout/8)
	}
	t := time.NewTicker(max(period, 5*time.Millisecond))
	defer t.Stop()
	var conns []*Conn
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			conns = s.snapshot(conns[:0])
			sinceEpoch := now.Sub(s.cfg.epoch)
			for _, c := range conns {
				if fs := c.frameStart.Load(); fs != 0 && s.frameTimeout > 0 && sinceEpoch-time.Duration(fs-1) >= s.frameTimeout {
					c.closeBetweenFrames(errFrameStalled) // or at the next tick
					continue
				}
				if s.idleTimeout <= 0 {
					continue
				}
				// A change in the activity count since the last look, or anything in flight,
				// restarts the idle clock; the clock is only read here, so a connection is
				// never closed early, and at most two ticks late.
				if a := c.activity.Load(); a != c.idleSeen {
					c.idleSeen, c.idleSince = a, now
					continue
				}
				// Nothing happened since the last look. Nothing working either (deferred
				// requests, such as long-polling pulls, may wait, holding no goroutine):
				// keep only what an idle connection needs. A consumer's connection always
				// has pulls parked, and would otherwise keep its burst's workers for good.
				if c.inflight.Load() == 0 && c.responding.Load() == 0 {
					c.shed()
				}
				if !c.idle() {
					c.idleSince = now
					continue
				}
				if now.Sub(c.idleSince) >= s.idleTimeout {
					c.closeBetweenFrames(errIdle) // or at the next tick
				}
			}
			clear(conns)
		}
	}
}
