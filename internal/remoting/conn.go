package remoting

// A Conn's type, configuration and lifecycle. A Conn is open from newConn until the first
// closeWithErr, which sets err, empties the pending-call table (nil from then on), closes
// done, cancels the Handlers' context and closes the socket, once. Its read goroutine (run)
// then tears down in order: deferred requests dropped, orphaned InvokeAsync calls failed,
// every Handler call returned, the flusher ended, and only then the close callback.
//
// Lock order within a Conn: the write lock (wmu) may be held while the pending-call lock
// (pmu) is taken (a failing write closes the connection), never the other way round. The
// write queue's lock (qmu) is a leaf, never held during a write; so is the deferred list's
// (dmu): a Deferred's answer is written, and onDrop called, outside it.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// readBufferSize is the read buffer's size. The reader reads frames larger than it straight
// into the frame.
const readBufferSize = 16 << 10

// Defaults shared by ServerOptions and ClientOptions.
const (
	DefaultMaxInFlightPerConn = 256
	DefaultMaxParkedPerConn   = 4096
	DefaultIdleTimeout        = 120 * time.Second
	DefaultWriteTimeout       = 10 * time.Second
	DefaultDialTimeout        = 3 * time.Second
	DefaultFrameReadTimeout   = 30 * time.Second
	DefaultMaxConns           = 10000
)

// connConfig is what a Conn takes from the Server, Client or Dial call that made it. One value
// is shared by all the Conns of its owner and does not change once they exist.
type connConfig struct {
	handler Handler
	// inline is handler when it implements InlineHandler, else nil.
	inline InlineHandler
	// rawExt is the handler's RawExt when it implements RawExtHandler, else nil.
	rawExt func(protocol.RequestCode) bool
	// lend is set when handler implements LendingInlineHandler.
	lend         bool
	maxFrame     int
	maxInFlight  int32
	maxParked    int32
	writeTimeout time.Duration // <= 0: none
	// epoch is the origin of Conn.frameStart: a monotonic clock reading shared by the owner's
	// Conns.
	epoch     time.Time
	logger    *slog.Logger
	serialize protocol.SerializeType
	// mirrorPeer makes a Conn send its own requests in the serialize type of the last request
	// the peer sent: on the server side, the peer has shown it speaks that one.
	mirrorPeer bool
	// draining is the Server's shutdown flag (nil on the client side). While it is set, new
	// requests are refused so that in-flight ones can finish.
	draining *atomic.Bool
	onOpen   func(*Conn)
	onClose  func(*Conn)
	// sendfileMin is the smallest file region sent with sendfile; < 0: none (see
	// ServerOptions.SendfileThreshold).
	sendfileMin int64
	// frames recycles encode buffers across the owner's Conns.
	frames sync.Pool
	// calls recycles the channels Invoke waits on (two allocations each: a channel of
	// pointers has its buffer apart). Only a channel known to be empty and out of every
	// pending table goes back.
	calls sync.Pool
}

func (cfg *connConfig) getCall() chan *protocol.Command {
	if v := cfg.calls.Get(); v != nil {
		return v.(chan *protocol.Command)
	}
	return make(chan *protocol.Command, 1)
}

func (cfg *connConfig) getFrame() *[]byte {
	if v := cfg.frames.Get(); v != nil {
		return v.(*[]byte)
	}
	b := make([]byte, 0, 512)
	return &b
}

func (cfg *connConfig) putFrame(bp *[]byte, b []byte) {
	if cap(b) > maxPooledFrame {
		return
	}
	*bp = b[:0]
	cfg.frames.Put(bp)
}

// Conn is one remoting connection, on either side. It is safe for concurrent use.
type Conn struct {
	nc     net.Conn
	raw    syscall.RawConn // nc's descriptor, for sendfile; nil where that is not used
	cfg    *connConfig
	log    *slog.Logger
	raddr  string
	br     *bufio.Reader // read goroutine only
	ctx    context.Context
	cancel context.CancelCauseFunc

	serialize atomic.Uint32 // protocol.SerializeType of requests this side sends
	inflight  atomic.Int32  // Handler calls running or being admitted, parked ones aside
	parked    atomic.Int32  // requests deferred with Defer: waiting for an event, not working
	// responding counts Handler calls that returned and whose response is being written; they
	// no longer count against the in-flight bound but keep the connection from closing idle.
	responding atomic.Int32
	activity   atomic.Uint64 // frames read plus Handler calls finished: the idle sweeper's clock
	handlers   sync.WaitGroup
	// work hands a request to a worker waiting for one (unbuffered: a send succeeds only
	// when one waits); idleWorkers counts those waiting.
	work        chan *protocol.Command
	idleWorkers atomic.Int32
	// frameStart is when the read goroutine began a frame that had not arrived whole, as
	// 1 + nanoseconds since cfg.epoch; 0 between frames. The Server's sweeper closes a
	// connection whose frame has been arriving for longer than its FrameReadTimeout.
	frameStart atomic.Int64

	// The writer. A goroutine that has a frame to send queues it; if no write is under way it
	// becomes the writer, takes every frame queued by then and writes them with one system
	// call. Frames queued meanwhile form the next batch, whose callers wait for it; when the
	// writer is done it hands the next batch to one of them. Nothing ever waits for more
	// frames to arrive: a frame queued on an idle connection is written at once by its own
	// caller.
	//
	// Frames of InvokeAsync calls have no caller waiting for their write: when no write is
	// under way they are handed to the connection's flusher goroutine (started on the first
	// such frame), which writes whatever is queued, again and again, until the queue is
	// empty. A caller that sends many requests in a row thus only encodes and queues them,
	// and they leave gathered while the previous write is in the kernel.
	qmu     sync.Mutex
	queue   []queuedFrame // guarded by qmu: frames waiting for the next write
	qbatch  *writeBatch   // guarded by qmu: the batch of the queued frames' waiting callers; nil when none waits
	writing bool          // guarded by qmu: a writer holds or has been handed the queue
	spare   []queuedFrame // guarded by qmu: the last written batch's slice, for reuse
	// qbuf holds the queued frames encoded in place (inBuf), one after another in queue
	// order: a batch of them leaves with one write of qbuf, with no buffer per frame to get
	// from a pool and no copy to gather them. qspare is the last written one, for reuse.
	qbuf   []byte // guarded by qmu
	qspare []byte // guarded by qmu
	// kick hands the queue to the flusher (one token: the flusher is then the writer).
	kick     chan struct{}
	flusher  bool           // guarded by qmu: the flusher goroutine was started
	flushing sync.WaitGroup // the flusher goroutine; Add only under qmu on an open connection

	wmu       sync.Mutex // held while frames are written to nc
	wbuf      []byte     // guarded by wmu: where a batch's frames are gathered
	wdeadline time.Time  // guarded by wmu: the write deadline last set on nc

	pmu     sync.Mutex
	pending map[int32]pendingCall // guarded by pmu: waiting calls by opaque; nil once closed
	// watches are the contexts' watches of the pending InvokeAsync calls, by Done channel;
	// guarded by pmu (see ctxWatch).
	watches    map[<-chan struct{}]*ctxWatch
	nextOpaque int32           // guarded by pmu
	lanes      []*deadlineLane // guarded by pmu: InvokeAsync deadlines, by timeout
	calls      sync.Pool       // finished InvokeAsync calls (*asyncCall), for reuse

	// Deferred requests waiting for their answer (see Defer), so that a close can drop them.
	dmu     sync.Mutex
	dhead   *requestCtx // guarded by dmu
	dclosed bool        // guarded by dmu: set once the close dropped them; Defer refuses then

	closeOnce sync.Once
	done      chan struct{}
	err       error        // set before done is closed
	orphans   []*asyncCall // InvokeAsync calls pending at the close, set with err; failed by run

	// Owned by the Server's idle sweeper goroutine.
	idleSeen  uint64
	idleSince time.Time
}

func newConn(nc net.Conn, cfg *connConfig) *Conn {
	ctx, cancel := context.WithCancelCause(context.Background())
	raddr := nc.RemoteAddr().String()
	c := &Conn{
		nc:        nc,
		raw:       socketRaw(nc),
		cfg:       cfg,
		log:       cfg.logger.With("remote", raddr),
		raddr:     raddr,
		br:        bufio.NewReaderSize(nc, readBufferSize),
		ctx:       ctx,
		cancel:    cancel,
		pending:   make(map[int32]pendingCall),
		kick:      make(chan struct{}, 1),
		work:      make(chan *protocol.Command),
		done:      make(chan struct{}),
		idleSince: time.Now(),
	}
	c.serialize.Store(uint32(cfg.serialize))
	return c
}

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// LocalAddr is this side's address.
func (c *Conn) LocalAddr() net.Addr { return c.nc.LocalAddr() }

// Done is closed when the connection has closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is nil while the connection is open. Afterwards it says why it closed; it wraps
// ErrConnClosed and the cause.
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection at once. Pending calls fail with ErrConnClosed and the Handler
// contexts of requests being served are cancelled. It is safe to call more than once.
func (c *Conn) Close() error {
	c.closeWithErr(errClosedLocally)
	return nil
}

// closeWithErr closes the connection with the given cause; only the first call has an effect.
func (c *Conn) closeWithErr(cause error) {
	c.closeOnce.Do(func() {
		c.err = &connClosedError{addr: c.raddr, cause: cause}
		c.pmu.Lock()
		var async []*asyncCall
		for _, pc := range c.pending {
			if pc.async != nil {
				pc.async.gone = true
				async = append(async, pc.async)
			}
		}
		c.pending = nil
		c.stopLanesLocked()
		c.stopWatchesLocked()
		c.pmu.Unlock()
		// Failed by the read goroutine once it sees the close (run), not here: this may run
		// under the write lock, and callbacks may send.
		c.orphans = async
		close(c.done)
		c.cancel(c.err)
		_ = c.nc.Close()
	})
}

// failOrphans fails the InvokeAsync calls the close left pending. Called by run after
// closeWithErr, which (through closeOnce) has set orphans by then.
func (c *Conn) failOrphans() {
	for _, a := range c.orphans {
		a.finish(nil, fmt.Errorf("invoke %s: %w", a.code, c.err))
	}
	c.orphans = nil
}

// closeBetweenFrames closes the connection if no frame is being written, so that the peer
// never sees half a frame, and reports whether it did. It does not wait for a write in
// progress (which may take up to the write timeout): callers try again later.
func (c *Conn) closeBetweenFrames(cause error) bool {
	if !c.wmu.TryLock() {
		return false
	}
	defer c.wmu.Unlock()
	c.closeWithErr(cause)
	return true
}

// idle reports whether nothing is in flight in either direction.
func (c *Conn) idle() bool {
	// In flight before parked and responding: Defer, and serve once the Handler returns, add
	// to those before they take from in flight, so a request moving between them is seen in
	// one or the other.
	if c.inflight.Load() > 0 || c.parked.Load() > 0 || c.responding.Load() > 0 {
		return false
	}
	// Then the writer: a response is queued (writing set) before it stops counting as
	// responding, and writing stays set until the queue has been written.
	c.qmu.Lock()
	writing := c.writing
	c.qmu.Unlock()
	if writing {
		return false
	}
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return len(c.pending) == 0
}

// run is the connection's read goroutine. It returns once the connection is closed, every
// Handler call has returned, and the close callback has run.
func (c *Conn) run() {
	if c.cfg.onOpen != nil {
		c.cfg.onOpen(c)
	}
	c.closeWithErr(c.readLoop())
	c.dropDeferred()
	c.failOrphans()
	c.logClose()
	c.handlers.Wait()
	// The flusher is only started under qmu on an open connection: past this barrier none
	// can start, and Wait cannot race an Add.
	c.qmu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier
	c.qmu.Unlock()
	c.flushing.Wait()
	if c.cfg.onClose != nil {
		c.cfg.onClose(c)
	}
}

func (c *Conn) logClose() {
	err := c.err
	switch {
	case errors.Is(err, protocol.ErrMalformedFrame), errors.Is(err, protocol.ErrFrameTooLarge),
		errors.Is(err, protocol.ErrUnknownSerialize), errors.Is(err, io.ErrUnexpectedEOF):
		c.log.Warn("closing connection: broken frame", "err", err)
	case errors.Is(err, errIdle):
		c.log.Info("closed idle connection")
	case errors.Is(err, errFrameStalled):
		c.log.Warn("closed connection stalled mid-frame", "err", err)
	case errors.Is(err, io.EOF), errors.Is(err, errClosedLocally), errors.Is(err, errServerShutdown):
		c.log.Debug("connection closed", "err", err)
	default:
		c.log.Debug("connection lost", "err", err)
	}
}
