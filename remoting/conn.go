package remoting

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// Handler serves the requests that arrive on a connection.
//
// ServeRemoting returns the response to req, or nil to send none. The transport makes the
// response fit req whatever the Handler built: it carries req's opaque and serialize type and
// the response flag. A response to a oneway request is dropped.
//
// Each request is served on its own goroutine, so ServeRemoting may block (a long-polling pull
// does) without holding up other requests on the same connection; only the requests an
// InlineHandler vouches for are served on the connection's read goroutine. ctx is cancelled when the
// connection closes; a Handler that blocks must watch it, and one that waits for an event
// rather than working should call Park(ctx) first, or Defer(ctx) and return, answering later
// through the Deferred without holding a goroutine. req.Body is the Handler's to keep.
// A panic is recovered, logged, and answered SYSTEM_ERROR.
type Handler interface {
	ServeRemoting(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command
}

// InlineHandler is a Handler that can tell, request by request, that serving a request never
// blocks: it only works in memory (or appends to a page cache), with no lock held for long by
// others, no disk sync and no network call. Such a request is served on the connection's read
// goroutine, with no goroutine hand-off: a 1 KiB send costs less than the wake-up of another
// goroutine and the growth of its stack through the Handler's call chain (see RATIONALE.md).
//
// Inline is asked for every request admitted under the in-flight bound, on the read
// goroutine; it must be cheap and must not block (it looks at req's code and ExtFields and
// at state in memory). It may answer false whenever unsure: the request is then served on
// its own goroutine as usual. A request served inline is counted in flight like any other,
// a panic in it is recovered and answered SYSTEM_ERROR, and its response is queued for the
// connection's flusher as usual. Park called by an inline request returns false: the
// Handler answers at once instead of waiting, since waiting would hold up the connection's
// reads; an inline request may still answer later through DeferInFlight. While an inline
// request is served, no other frame of its connection is read.
type InlineHandler interface {
	Handler
	Inline(req *protocol.Command) bool
}

// RawExtHandler is a Handler that reads the header fields of some requests itself, from
// protocol.Command.RawExt: for a request with a binary (ROCKETMQ) header whose code RawExt
// reports true, the transport leaves ExtFields nil and does not build its map (see
// protocol.ReadFrameRawExt). RawExt is asked on the read goroutine for every such frame and
// must be cheap. Requests with JSON headers always come with ExtFields.
type RawExtHandler interface {
	Handler
	RawExt(code protocol.RequestCode) bool
}

// LendingInlineHandler is an InlineHandler whose inline requests borrow their body: the
// Body of a request served on the read goroutine points into the connection's read buffer
// (protocol.ReadFrameLent) and is valid only until ServeRemoting returns; the Handler
// copies whatever it keeps of it, and does not answer with it. That saves a copy and an
// allocation per request (a 1 KiB send: the body was a quarter of the bytes allocated per
// message). Requests served on goroutines of their own, and responses, own their body.
type LendingInlineHandler interface {
	InlineHandler
	LendInlineBody()
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command

// ServeRemoting calls f.
func (f HandlerFunc) ServeRemoting(ctx context.Context, c *Conn, req *protocol.Command) *protocol.Command {
	return f(ctx, c, req)
}

// Buffer sizes. The reader reads frames larger than its buffer straight into the frame.
const (
	readBufferSize = 16 << 10
	// maxGatheredWrite is the most a batch of frames is copied into one buffer for a single
	// write; a larger batch is written with writev, frame by frame.
	maxGatheredWrite = 256 << 10
	// maxPooledFrame is the largest encode buffer kept for reuse: one large pull response must
	// not pin megabytes per connection for its lifetime. It holds a producer's batch of
	// 256 KiB (WithAsyncBatching's usual bound) with its header.
	maxPooledFrame = 260 << 10
	// minWritevFrame: a batch holding a frame this large is written with writev rather than
	// copied into one buffer, whatever its total.
	minWritevFrame = 32 << 10
	// maxIdleWorkers bounds the goroutines a connection keeps waiting for its next request.
	maxIdleWorkers = 16
)

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
	parked    atomic.Int32  // Handler calls that called Park: waiting for an event, not working
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

	pmu        sync.Mutex
	pending    map[int32]pendingCall // guarded by pmu: waiting calls by opaque; nil once closed
	nextOpaque int32                 // guarded by pmu
	lanes      []*deadlineLane       // guarded by pmu: InvokeAsync deadlines, by timeout

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
	// In flight before parked and responding: Park, and serve once the Handler returns, add
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

// Invoke sends req and waits for its response, for ctx to end, or for the connection to
// close.
//
// Invoke sets req.Opaque to a number unused on this connection, clears req's response and
// oneway flags, and sets req.Serialize to the connection's serialize type; req must not be
// shared with a concurrent call. An error that ends the wait wraps ctx.Err() or ErrConnClosed.
// A response that arrives after ctx ended is dropped.
func (c *Conn) Invoke(ctx context.Context, req *protocol.Command) (*protocol.Command, error) {
	resp, _, err := c.invoke(ctx, req)
	return resp, err
}

// InvokeOneway sends req with the oneway flag; there is no response. It returns once req has
// been written to the socket, or queued behind a write in progress whose writer will flush it.
// ctx is checked before sending: a write once started runs to completion or to the write
// timeout. Like Invoke, it sets req's opaque, flags and serialize type.
func (c *Conn) InvokeOneway(ctx context.Context, req *protocol.Command) error {
	_, err := c.invokeOneway(ctx, req)
	return err
}

func (c *Conn) invokeOneway(ctx context.Context, req *protocol.Command) (sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("invoke %s oneway on %s: %w", req.RequestCode(), c.raddr, err)
	}
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		return false, fmt.Errorf("invoke %s oneway: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	c.nextOpaque++
	req.Opaque = c.nextOpaque
	c.pmu.Unlock()
	req.Flag = req.Flag&^protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	sent, err = c.writeCommand(req)
	if err != nil {
		return sent, fmt.Errorf("invoke %s oneway: %w", req.RequestCode(), err)
	}
	return true, nil
}

// invoke is Invoke that also reports whether any of req may have reached the peer; a Client
// redials and retries only requests that certainly did not.
func (c *Conn) invoke(ctx context.Context, req *protocol.Command) (resp *protocol.Command, sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, err)
	}
	ch := c.cfg.getCall()
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		c.cfg.calls.Put(ch)
		return nil, false, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	opaque := c.nextOpaqueLocked()
	c.pending[opaque] = pendingCall{ch: ch}
	c.pmu.Unlock()

	req.Opaque = opaque
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	if sent, err := c.writeCommand(req); err != nil {
		c.forget(opaque, ch)
		return nil, sent, fmt.Errorf("invoke %s: %w", req.RequestCode(), err)
	}
	select {
	case resp := <-ch:
		c.cfg.calls.Put(ch) // deliver removed it from pending before sending its one value
		return resp, true, nil
	case <-ctx.Done():
		c.forget(opaque, ch)
		return nil, true, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, ctx.Err())
	case <-c.done:
		select {
		case resp := <-ch: // delivered just before the close
			return resp, true, nil
		default:
		}
		return nil, true, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err)
	}
}

// nextOpaqueLocked returns an opaque no pending call uses; pmu must be held.
func (c *Conn) nextOpaqueLocked() int32 {
	opaque := c.nextOpaque + 1
	for _, taken := c.pending[opaque]; taken; _, taken = c.pending[opaque] {
		opaque++ // only after 2^32 calls, with one still waiting
	}
	c.nextOpaque = opaque
	return opaque
}

// forget removes an abandoned call. If it was still pending nobody can send on ch any more
// and ch is recycled; otherwise deliver holds it and it is left to the garbage collector.
func (c *Conn) forget(opaque int32, ch chan *protocol.Command) {
	c.pmu.Lock()
	_, found := c.pending[opaque]
	if found {
		delete(c.pending, opaque)
	}
	c.pmu.Unlock()
	if found {
		c.cfg.calls.Put(ch)
	}
}

// deliver hands a response to the call waiting for it: an Invoke's channel, or an
// InvokeAsync's callback, which runs here, on the read goroutine.
func (c *Conn) deliver(resp *protocol.Command) {
	c.pmu.Lock()
	pc, ok := c.pending[resp.Opaque]
	if ok {
		delete(c.pending, resp.Opaque)
		if a := pc.async; a != nil {
			a.gone = true
			if a.lane != nil {
				a.lane.trimLocked()
			}
		}
	}
	c.pmu.Unlock()
	if !ok {
		// The caller gave up (its context ended) or the peer is confused; either way nobody
		// is waiting.
		c.log.Debug("dropping response nobody waits for", "opaque", resp.Opaque, "code", resp.ResponseCode())
		return
	}
	if pc.async == nil || !pc.async.raw {
		resp.BuildExtFields() // read raw (see readLoop): this caller reads the map
	}
	if pc.async != nil {
		pc.async.finish(resp, nil)
		return
	}
	pc.ch <- resp // buffered, and each channel gets one response
}

// queuedFrame is an encoded frame waiting to be written, with the pooled buffer it lives in.
// A frame with regions is only its header in frame (with the regions counted in its length);
// release is then called once it has been written or has failed.
type queuedFrame struct {
	bp      *[]byte
	frame   []byte
	regions []FileRegion
	release func()
	// inBuf: the frame is qbuf[lo:hi] of its batch (bp and frame are nil until the writer
	// takes the batch and slices frame out of it).
	inBuf  bool
	lo, hi int
}

// writeBatch is the outcome of one write, shared by the callers whose frames it carried.
type writeBatch struct {
	// done is closed once the batch has been written or has failed; err and written are set
	// before.
	done    chan struct{}
	err     error
	written bool
	// lead hands the batch to one of its callers, who writes it: the writer before it sends
	// one token when it finishes and finds this batch queued.
	lead chan struct{}
}

// writeCommand encodes cmd and writes it. written is false only when nothing of cmd reached
// the socket because the connection was already closed; an encoding error is returned as is
// and leaves the connection open; any other error closes the connection and wraps
// ErrConnClosed.
func (c *Conn) writeCommand(cmd *protocol.Command) (written bool, err error) {
	return c.writeFrame(cmd, nil, nil)
}

// writeFrame is writeCommand for a command whose body is regions of files (none: cmd.Body).
// release, if not nil, is called once whatever happens.
func (c *Conn) writeFrame(cmd *protocol.Command, regions []FileRegion, release func()) (written bool, err error) {
	var qf queuedFrame
	if len(regions) > 0 {
		bp := c.cfg.getFrame()
		frame, err := cmd.AppendFrame((*bp)[:0])
		if err == nil {
			if err = appendRegionsLength(frame, regions); err != nil {
				err = fmt.Errorf("encode %s: %w", cmd, err)
			}
		}
		if err != nil {
			c.cfg.putFrame(bp, frame)
			if release != nil {
				release()
			}
			return false, err
		}
		qf = queuedFrame{bp: bp, frame: frame, regions: regions, release: release}
		c.qmu.Lock()
		select {
		case <-c.done:
			c.qmu.Unlock()
			c.cfg.putFrame(bp, frame)
			if release != nil {
				release()
			}
			return false, c.err
		default:
		}
	} else {
		c.qmu.Lock()
		select {
		case <-c.done:
			c.qmu.Unlock()
			if release != nil {
				release()
			}
			return false, c.err
		default:
		}
		if qf, err = c.encodeQueuedLocked(cmd); err != nil {
			c.qmu.Unlock()
			if release != nil {
				release()
			}
			return false, err
		}
		qf.release = release
	}
	c.queue = append(c.queue, qf)
	b := c.qbatch
	if b == nil {
		b = &writeBatch{done: make(chan struct{}), lead: make(chan struct{}, 1)}
		c.qbatch = b
	}
	if c.writing {
		// Whoever writes now (a caller or the flusher) writes our frame next or hands its
		// batch to one of us.
		c.qmu.Unlock()
		// A write is under way: ours leaves with the next one, written by whichever caller
		// of this batch is handed it.
		select {
		case <-b.done:
			return b.written, b.err
		case <-b.lead:
		}
	} else {
		c.writing = true
		c.qmu.Unlock()
	}
	c.writeQueued(false)
	<-b.done // closed by writeQueued: our frame was in the batch it wrote
	return b.written, b.err
}

// queueCommand encodes cmd and queues it for the flusher, without waiting for the write. An
// encoding error is returned as is; a closed connection returns its error and queues nothing.
// A failing write later closes the connection, which fails the calls pending on it.
func (c *Conn) queueCommand(cmd *protocol.Command) error {
	c.qmu.Lock()
	select {
	case <-c.done:
		c.qmu.Unlock()
		return c.err
	default:
	}
	qf, err := c.encodeQueuedLocked(cmd)
	if err != nil {
		c.qmu.Unlock()
		return err
	}
	c.queue = append(c.queue, qf)
	if !c.writing {
		c.writing = true
		c.kickFlusherLocked()
	}
	c.qmu.Unlock()
	return nil
}

// encodeQueuedLocked encodes cmd at the end of qbuf and returns its queue entry, or the
// encoding error, leaving qbuf as it was; qmu must be held. Encoding under the lock holds
// up others queueing on the connection for the encoding's time, a microsecond for a 1 KiB
// send; their frames leave in the same write anyway.
func (c *Conn) encodeQueuedLocked(cmd *protocol.Command) (queuedFrame, error) {
	if c.qbuf == nil {
		c.qbuf, c.qspare = c.qspare[:0], nil
	}
	lo := len(c.qbuf)
	buf, err := cmd.AppendFrame(c.qbuf) // on error, c.qbuf[:lo]
	if err != nil {
		return queuedFrame{}, err
	}
	c.qbuf = buf
	return queuedFrame{inBuf: true, lo: lo, hi: len(buf)}, nil
}

// flusherIdle is how long a flusher without work waits before it ends; the next queued frame
// starts another. A busy connection keeps its flusher, an idle one (most of a broker's) costs
// no goroutine.
const flusherIdle = 5 * time.Second

// kickFlusherLocked hands the queue to the flusher, which becomes the writer, starting it if
// it is not running. qmu must be held, and the caller must be the writer (or have just set
// writing). On a closed connection nobody writes any more: the queue is dropped (the close
// fails the calls whose frames they were).
func (c *Conn) kickFlusherLocked() {
	select {
	case <-c.done:
		for i := range c.queue {
			if f := c.queue[i]; f.bp != nil {
				c.cfg.putFrame(f.bp, f.frame)
			}
			c.queue[i] = queuedFrame{}
		}
		c.queue = c.queue[:0]
		c.qbuf = c.qbuf[:0]
		c.writing = false
		return
	default:
	}
	if !c.flusher {
		// Only here, under qmu on an open connection: run's barrier relies on it.
		c.flusher = true
		c.flushing.Add(1)
		go c.flushLoop()
	}
	c.kick <- struct{}{} // buffered, one token: there is one writer
}

// flushLoop is the flusher: each token on kick makes it the writer until the queue is empty.
// It ends after flusherIdle without a token, or when the connection closes.
func (c *Conn) flushLoop() {
	defer c.flushing.Done()
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	for {
		select {
		case <-c.kick:
		case <-c.done:
			select {
			case <-c.kick: // handed the queue as the connection closed: release its callers
			default:
				return
			}
		case <-idle.C:
			c.qmu.Lock()
			if len(c.kick) == 0 { // tokens are only sent under qmu: none can come now
				c.flusher = false
				c.qmu.Unlock()
				return
			}
			c.qmu.Unlock()
			<-c.kick
		}
		for c.writeQueued(true) {
		}
		idle.Reset(flusherIdle)
	}
}

// queuedFrames is how many frames wait for the next write.
func (c *Conn) queuedFrames() int {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	return len(c.queue)
}

// writeQueued writes every frame queued now as one batch. If frames were queued meanwhile,
// the flusher (flusher true) reports that it goes on writing them; a calling writer hands
// them on to a caller waiting for the next batch, or, when none waits (only InvokeAsync
// frames), to the flusher. The caller must be the writer (it set writing, received the
// batch's lead token, or is the flusher handed the kick token).
func (c *Conn) writeQueued(flusher bool) (again bool) {
	c.qmu.Lock()
	frames, b, buf := c.queue, c.qbatch, c.qbuf
	c.queue, c.qbatch = c.spare[:0], nil
	c.spare = nil
	c.qbuf = nil // the next frame takes qspare, or a new buffer
	c.qmu.Unlock()

	written, err := c.writeFrames(frames, buf)
	for i := range frames {
		if f := frames[i]; f.bp != nil {
			c.cfg.putFrame(f.bp, f.frame)
		}
		if frames[i].release != nil {
			frames[i].release()
		}
		frames[i] = queuedFrame{}
	}

	c.qmu.Lock()
	c.spare = frames[:0]
	// Both buffers are kept (but not a large one): a buffer dropped is grown again, by
	// doubling, with the next frames.
	switch {
	case cap(buf) > maxGatheredWrite:
	case c.qbuf == nil:
		c.qbuf = buf[:0]
	case cap(buf) > cap(c.qspare):
		c.qspare = buf[:0]
	}
	switch {
	case len(c.queue) == 0:
		c.writing = false
	case flusher:
		again = true
	case c.qbatch != nil:
		c.qbatch.lead <- struct{}{} // buffered, one token per batch: we stay the writer until it is taken
	default:
		c.kickFlusherLocked() // only frames nobody waits for: the flusher takes them
	}
	c.qmu.Unlock()
	if b != nil {
		b.written, b.err = written, err
		close(b.done)
	}
	return again
}

// writeFrames writes frames to the socket with one system call where it can (large batches
// may take more), under the write lock.
func (c *Conn) writeFrames(frames []queuedFrame, buf []byte) (written bool, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return false, c.err
	default:
	}
	if wt := c.cfg.writeTimeout; wt > 0 {
		// Re-arming the deadline costs a runtime timer update; doing it only when less than
		// 7/8 of the timeout is left keeps it off the path of back-to-back writes.
		if now := time.Now(); c.wdeadline.Sub(now) < wt-wt/8 {
			c.wdeadline = now.Add(wt)
			_ = c.nc.SetWriteDeadline(c.wdeadline)
		}
	}
	total, largest := 0, 0
	regions, inBuf := false, 0
	for i := range frames {
		f := &frames[i]
		if f.inBuf {
			f.frame = buf[f.lo:f.hi]
			inBuf++
		}
		total += len(f.frame)
		largest = max(largest, len(f.frame))
		regions = regions || len(f.regions) > 0
	}
	switch {
	case inBuf == len(frames):
		// All encoded in place, in order: buf is the batch, written as it is.
		_, err = c.nc.Write(buf)
	case regions:
		err = c.writeWithRegions(frames)
	case len(frames) == 1:
		_, err = c.nc.Write(frames[0].frame)
	case total <= maxGatheredWrite && largest < minWritevFrame:
		// Gathered into one buffer: one write on any net.Conn, and small frames cost less to
		// copy than to describe to writev one by one.
		buf := c.wbuf[:0]
		for _, f := range frames {
			buf = append(buf, f.frame...)
		}
		_, err = c.nc.Write(buf)
		if cap(buf) <= maxGatheredWrite {
			c.wbuf = buf[:0]
		}
	default:
		bufs := make(net.Buffers, len(frames))
		for i, f := range frames {
			bufs[i] = f.frame
		}
		_, err = bufs.WriteTo(c.nc) // writev on a TCP connection
	}
	if err != nil {
		c.closeWithErr(fmt.Errorf("write: %w", err))
		return true, c.err
	}
	return true, nil
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
	c.qmu.Unlock() //nolint:staticcheck // an empty critical section is the barrier
	c.flushing.Wait()
	if c.cfg.onClose != nil {
		c.cfg.onClose(c)
	}
}

func (c *Conn) readLoop() error {
	for {
		// Wait for a frame's first byte with no clock running: between frames, only the idle
		// timeout applies.
		if _, err := c.br.Peek(1); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		started := !c.frameBuffered()
		if started {
			c.frameStart.Store(1 + int64(time.Since(c.cfg.epoch)))
		}
		var cmd *protocol.Command
		var lent bool
		var err error
		// Responses are read with their fields raw: deliver builds the map for the callers
		// that read it, and those of InvokeAsyncRaw skip it.
		cmd, lent, err = protocol.ReadFrameWith(c.br, protocol.ReadOptions{
			Max: c.cfg.maxFrame, RawExt: c.cfg.rawExt, RawResponses: true, Lend: c.cfg.lend,
		})
		if started {
			c.frameStart.Store(0)
		}
		if err != nil {
			var he *protocol.HeaderError
			if !errors.As(err, &he) {
				return fmt.Errorf("read: %w", err)
			}
			// The frame was whole: the stream is intact, and only this request is lost.
			c.activity.Add(1)
			c.badHeader(he)
			continue
		}
		c.activity.Add(1)
		if cmd.IsResponse() {
			if lent {
				cmd.Body = bytes.Clone(cmd.Body)
			}
			c.deliver(cmd)
			continue
		}
		c.dispatch(cmd, lent)
	}
}

// frameBuffered reports whether the next frame is in the read buffer whole, so that reading
// it cannot stall. Most frames are: then the frame costs no clock reading.
func (c *Conn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 4 {
		return false
	}
	p, _ := c.br.Peek(4) // buffered: does not block
	size := int64(int32(binary.BigEndian.Uint32(p)))
	return size >= 0 && size <= int64(n-4)
}

// badHeader answers a frame that arrived whole but whose header could not be read, and keeps
// the connection: other requests on it are fine, and a peer that sent one bad header (a field
// of an unexpected type, say) should get an answer rather than lose every call it has pending.
//
// A request whose opaque is known is answered INVALID_PARAMETER with the decoding error as
// the remark. A response whose opaque is known completes the waiting call with a
// SYSTEM_ERROR response saying why. Without the opaque there is nobody to answer: an answer
// with a guessed opaque could complete some other call, so the frame is only logged.
func (c *Conn) badHeader(he *protocol.HeaderError) {
	switch {
	case !he.OpaqueKnown:
		c.log.Warn("dropping frame with an unreadable header and no opaque", "err", he)
	case he.IsResponse():
		c.log.Warn("response with an unreadable header", "opaque", he.Opaque, "err", he)
		c.deliver(&protocol.Command{
			Code: int16(protocol.SystemError), Language: protocol.LangGo, Version: protocol.Version,
			Opaque: he.Opaque, Flag: protocol.FlagResponse, Serialize: he.Serialize,
			Remark: "unreadable response header: " + he.Error(), ExtFields: map[string]string{},
		})
	case he.IsOneway():
		c.log.Warn("dropping oneway request with an unreadable header", "code", protocol.RequestCode(he.Code), "err", he)
	default:
		c.log.Debug("answering request with an unreadable header", "code", protocol.RequestCode(he.Code), "opaque", he.Opaque, "err", he)
		req := &protocol.Command{Code: he.Code, Opaque: he.Opaque, Serialize: he.Serialize}
		c.respond(req, protocol.NewResponse(req, protocol.InvalidParameter, he.Error()))
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

// dispatch admits a request and serves it on its own goroutine, or refuses it.
//
// lent says that req.Body is borrowed from the read buffer (see LendingInlineHandler): it
// is copied unless req is served inline.
func (c *Conn) dispatch(req *protocol.Command, lent bool) {
	if c.cfg.mirrorPeer && uint32(req.Serialize) != c.serialize.Load() {
		c.serialize.Store(uint32(req.Serialize))
	}
	// Count first, then look at the drain flag: Shutdown sets the flag, then reads the count.
	// Whichever order the two goroutines run in, either Shutdown sees this request in flight
	// or this request sees the flag (both are sequentially consistent atomics).
	n := c.inflight.Add(1)
	var refuse string
	switch {
	case c.cfg.draining != nil && c.cfg.draining.Load():
		refuse = "server is shutting down"
	case n > c.cfg.maxInFlight:
		refuse = "too many requests in flight on this connection"
	}
	if refuse != "" {
		c.inflight.Add(-1)
		if req.IsOneway() {
			c.log.Warn("dropping oneway request", "code", req.RequestCode(), "reason", refuse)
			return
		}
		c.log.Debug("refusing request", "code", req.RequestCode(), "reason", refuse)
		c.respond(req, protocol.NewResponse(req, protocol.SystemBusy, refuse))
		return
	}
	c.handlers.Add(1)
	if c.cfg.inline != nil && c.askInline(req) {
		c.serve(req, true)
		return
	}
	if lent {
		req.Body = bytes.Clone(req.Body)
	}
	select {
	case c.work <- req: // an idle worker takes it
	default:
		go c.worker(req)
	}
}

// worker serves req and then, while fewer than maxIdleWorkers others wait, waits for the
// next request of the connection instead of exiting. A fresh goroutine per request grows its
// stack from the minimum through the Handler's call chain every time; a kept one has grown
// it once. Workers waiting are not in flight and end when the connection closes.
func (c *Conn) worker(req *protocol.Command) {
	for {
		c.serve(req, false)
		if c.idleWorkers.Add(1) > maxIdleWorkers {
			c.idleWorkers.Add(-1)
			return
		}
		select {
		case req = <-c.work:
			c.idleWorkers.Add(-1)
			if req == nil { // shed: the connection went idle
				return
			}
		case <-c.done:
			c.idleWorkers.Add(-1)
			return
		}
	}
}

// shed lets go of what a connection keeps only to serve its next burst faster: the request
// goroutines waiting for work (each with a stack grown through the Handler, up to
// maxIdleWorkers of them) and the buffers its last batches of frames were encoded and
// gathered in (up to maxGatheredWrite each). The Server's sweeper calls it on connections that stayed idle for a
// sweep, so that many idle connections cost little more than their read goroutine and read
// buffer; both come back with the next traffic.
func (c *Conn) shed() {
	for c.idleWorkers.Load() > 0 {
		select {
		case c.work <- nil:
		default:
			return // the worker counted has not reached its wait yet, or took a request
		}
	}
	if c.wmu.TryLock() {
		c.wbuf = nil
		c.wmu.Unlock()
	}
	c.qmu.Lock()
	c.qspare = nil
	if len(c.qbuf) == 0 {
		c.qbuf = nil
	}
	c.qmu.Unlock()
}

// askInline asks the InlineHandler whether req may be served on the read goroutine. A
// panic in Inline is logged and taken as a no: the request is then served (and its panic,
// if any, answered) on its own goroutine.
func (c *Conn) askInline(req *protocol.Command) (inline bool) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("Inline panicked", "code", req.RequestCode(), "opaque", req.Opaque, "panic", r, "stack", string(debug.Stack()))
			inline = false
		}
	}()
	return c.cfg.inline.Inline(req)
}

// serve runs the Handler for req and queues its response; inline says that this is the
// read goroutine (see InlineHandler).
func (c *Conn) serve(req *protocol.Command, inline bool) {
	rc := &requestCtx{Context: c.ctx, c: c, inline: inline, code: req.Code, opaque: req.Opaque,
		serialize: req.Serialize, oneway: req.IsOneway()}
	defer c.handlers.Done()
	resp := c.callHandler(rc, req)
	if rc.deferred {
		// The request's slot and its answer belong to its Deferred now. A Handler that
		// deferred and still returned a response (a panic's SYSTEM_ERROR, say) answers
		// through it: whichever comes first goes out.
		if resp != nil {
			Deferred{rc}.Respond(resp)
		}
		c.activity.Add(1)
		return
	}
	answer := resp != nil && !req.IsOneway()
	files := rc.fileResp != nil && rc.fileResp == resp && answer
	if rc.fileResp != nil && !files && rc.fileRelease != nil {
		rc.fileRelease() // the Handler answered otherwise: the regions are not sent
	}
	if answer {
		// Counted as responding before it stops counting in flight, so that Shutdown and the
		// idle sweeper, which read in flight first, always see it in one or the other.
		c.responding.Add(1)
	}
	// The request leaves the in-flight bound before its response is written: a peer that
	// sends its next request as soon as it reads this response, at the bound, must not be
	// refused because this goroutine has not yet been scheduled after the write.
	if rc.state.Swap(reqFinished) == reqParked {
		c.parked.Add(-1)
	} else {
		c.inflight.Add(-1)
	}
	if answer {
		if files {
			c.respondFiles(req, resp, rc.fileRegions, rc.fileRelease)
		} else {
			c.respond(req, resp)
		}
		c.responding.Add(-1)
	}
	c.activity.Add(1)
}

// States of a request being served, for Park.
const (
	reqInFlight int32 = iota
	reqParked
	reqFinished
)

// requestCtx is the context a Handler is called with: the connection's, plus what Park needs
// to find the request. One allocation per request carries both.
type requestCtx struct {
	context.Context
	c     *Conn
	state atomic.Int32 // reqInFlight, reqParked or reqFinished
	// inline: served on the read goroutine, which must not wait (Park refuses).
	inline bool
	oneway bool

	// What a deferred answer needs of the request (see Defer), so that the request itself
	// is not kept while it waits.
	code      int16
	opaque    int32
	serialize protocol.SerializeType

	// deferred is set by Defer on the Handler's goroutine, before the Deferred escapes it;
	// inFlightDeferred too, by DeferInFlight: the request keeps its in-flight slot.
	deferred         bool
	inFlightDeferred bool
	// Guarded by the connection's dmu: the connection's list of deferred requests not yet
	// answered, and what to call if it closes first.
	listed       bool
	dprev, dnext *requestCtx
	onDrop       func()

	// Set by RespondWithFiles on the Handler's goroutine, read by serve on the same one once
	// the Handler returned.
	fileResp    *protocol.Command
	fileRegions []FileRegion
	fileRelease func()
}

// requestCtxKey is the context key under which a requestCtx finds itself.
type requestCtxKey struct{}

func (rc *requestCtx) Value(key any) any {
	if key == (requestCtxKey{}) {
		return rc
	}
	return rc.Context.Value(key)
}

// Park tells the transport that the request served with ctx (a Handler's context, or one
// derived from it) is about to wait for an event rather than work: a long-polling pull with
// nothing to return. The request then stops counting against its connection's in-flight bound
// (MaxInFlightPerConn) and counts against the parked bound (MaxParkedPerConn) instead, until
// its Handler returns. Without this, a consumer with a parked pull per queue fills the
// in-flight bound and its heartbeats, locks and commits on the same connection are refused.
//
// Park returns false, and changes nothing, when the connection already has its bound of parked
// requests: the Handler should then answer at once instead of waiting. It returns true when
// the request is parked, also when it already was, and for a context that does not come from
// this package (nothing to count). It returns false for a request served inline (see
// InlineHandler): waiting there would stop the connection's reads.
func Park(ctx context.Context) bool {
	rc, ok := ctx.Value(requestCtxKey{}).(*requestCtx)
	if !ok {
		return true
	}
	if rc.inline || rc.inFlightDeferred {
		return false
	}
	switch rc.state.Load() {
	case reqParked:
		return true
	case reqFinished:
		return false
	}
	c := rc.c
	// Take a parked slot first: the request is then counted somewhere at every moment, which
	// Shutdown and the idle sweeper rely on.
	if c.parked.Add(1) > c.cfg.maxParked {
		c.parked.Add(-1)
		c.log.Debug("parked request bound reached", "max", c.cfg.maxParked)
		return false
	}
	if !rc.state.CompareAndSwap(reqInFlight, reqParked) {
		c.parked.Add(-1)
		return rc.state.Load() == reqParked
	}
	// Should the Handler finish in between, serve has taken the request off the parked
	// count already; the totals still come out right.
	c.inflight.Add(-1)
	return true
}

func (c *Conn) callHandler(ctx context.Context, req *protocol.Command) (resp *protocol.Command) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("handler panicked", "code", req.RequestCode(), "opaque", req.Opaque, "panic", r, "stack", string(debug.Stack()))
			resp = protocol.NewResponse(req, protocol.SystemError, fmt.Sprintf("handler panic: %v", r))
		}
	}()
	if c.cfg.handler == nil {
		return protocol.NewResponse(req, protocol.RequestCodeNotSupported, fmt.Sprintf("request code %d not supported", req.Code))
	}
	return c.cfg.handler.ServeRemoting(ctx, c, req)
}

// respond writes resp as the response to req. A response that cannot be encoded (too large)
// is replaced by SYSTEM_ERROR so that the caller is not left waiting.
func (c *Conn) respond(req, resp *protocol.Command) {
	c.respondFiles(req, resp, nil, nil)
}

// respondFiles is respond for a response whose body is regions of files (none: resp.Body);
// release, if not nil, is called once.
func (c *Conn) respondFiles(req, resp *protocol.Command, regions []FileRegion, release func()) {
	if resp.Opaque != req.Opaque || resp.Serialize != req.Serialize ||
		resp.Flag&(protocol.FlagResponse|protocol.FlagOneway) != protocol.FlagResponse {
		// Fix a copy: the Handler may share its response value.
		fixed := *resp
		fixed.Opaque = req.Opaque
		fixed.Serialize = req.Serialize
		fixed.Flag = fixed.Flag&^protocol.FlagOneway | protocol.FlagResponse
		resp = &fixed
	}
	var err error
	if len(regions) > 0 {
		// Written before the handler's goroutine moves on: the regions pin their segments
		// until they are out, and the goroutine's wait bounds how many a connection holds.
		_, err = c.writeFrame(resp, regions, release)
	} else {
		// Queued for the flusher, not written here: the serving goroutine is free at once,
		// and the responses of many requests leave together without each waiting for the
		// write.
		err = c.queueCommand(resp)
	}
	if err == nil || errors.Is(err, ErrConnClosed) {
		return
	}
	c.log.Error("cannot encode response", "code", req.RequestCode(), "opaque", req.Opaque, "err", err)
	_ = c.queueCommand(protocol.NewResponse(req, protocol.SystemError, "response could not be encoded: "+err.Error()))
}
