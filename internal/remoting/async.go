package remoting

// InvokeAsync: calls that wait for their response with no goroutine, and their deadlines.
// Whoever takes a call out of the pending table (its response, its deadline, its context,
// the close) finishes it, so it finishes once. A deadline lane holds the calls of one
// timeout in the order they were made, which is the order of their deadlines: one timer,
// armed for the oldest pending, expires them all. Lanes are guarded by pmu.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// pendingCall is a call waiting for its response: an Invoke's channel or an InvokeAsync's
// callback (exactly one of the two is set).
type pendingCall struct {
	ch    chan *protocol.Command
	async *asyncCall
}

// AsyncReceiver receives the outcome of an InvokeAsyncRaw call.
type AsyncReceiver interface {
	// InvokeDone is called once, where and as InvokeAsync's done would be.
	InvokeDone(resp *protocol.Command, err error)
}

// asyncFunc adapts InvokeAsync's done to AsyncReceiver (a func is stored in an interface
// as it is: no allocation).
type asyncFunc func(*protocol.Command, error)

func (f asyncFunc) InvokeDone(resp *protocol.Command, err error) { f(resp, err) }

// asyncCall is an InvokeAsync waiting for its response. Whoever removes it from the pending
// table (the response, its deadline, its context, the connection's close) finishes it, so it
// finishes once.
type asyncCall struct {
	c      *Conn
	opaque int32
	code   protocol.RequestCode
	recv   AsyncReceiver
	// raw: the receiver reads the response's header fields raw (InvokeAsyncRaw); otherwise
	// its ExtFields map is built before it is handed over.
	raw bool
	// gone is set, under pmu, when the call leaves the pending table.
	gone bool
	// lane, when set, expires the call at deadline; otherwise timer does, if there is a
	// timeout. Set under pmu before the call can be taken out of the table.
	lane     *deadlineLane
	deadline time.Time
	timer    *time.Timer
	// watch, when set, abandons the call if its context ends; wprev and wnext link the
	// watch's calls. Guarded by pmu; cleared when the call leaves the pending table.
	watch        *ctxWatch
	wprev, wnext *asyncCall
	// gen counts the call's uses: a finished call goes back to its connection's pool (see
	// release) while a lane may still hold it, and the lane tells its entry from the call's
	// next use by gen. Written under pmu only.
	gen uint64
	// pooled: the call may be reused once finished; not when a timer of its own may still
	// call expire.
	pooled bool
}

// newCallLocked returns a call of the connection for receiver r, reused from its pool when
// one is free; pmu must be held, so that a lane or a caller still holding the call's previous
// use, which read it under pmu, see it change only under the lock.
func (c *Conn) newCallLocked(code protocol.RequestCode, r AsyncReceiver, raw bool) *asyncCall {
	a, _ := c.calls.Get().(*asyncCall)
	if a == nil {
		a = new(asyncCall)
	}
	gen := a.gen + 1
	*a = asyncCall{c: c, code: code, recv: r, raw: raw, gen: gen, pooled: true}
	return a
}

// finish stops the call's clocks and calls its receiver.
func (a *asyncCall) finish(resp *protocol.Command, err error) {
	if a.timer != nil {
		a.timer.Stop()
	}
	r := a.recv
	// A lane may hold the call a while longer (until the calls before it end): it must
	// not keep what the receiver refers to. Only the finisher reads recv and timer.
	a.recv, a.timer = nil, nil
	r.InvokeDone(resp, err)
	if a.pooled {
		// Nothing refers to the call now but lane entries, which check gen. One allocation
		// per call was a fifth of a producer's garbage.
		a.c.calls.Put(a)
	}
}

// takeLocked removes the call from the pending table if it is still there and reports
// whether it did; pmu must be held.
func (a *asyncCall) takeLocked() bool {
	c := a.c
	if a.gone || c.pending == nil {
		return false
	}
	if pc, ok := c.pending[a.opaque]; !ok || pc.async != a {
		return false
	}
	delete(c.pending, a.opaque)
	a.gone = true
	a.unwatchLocked()
	return true
}

// abandon finishes the call with err if it is still pending.
func (a *asyncCall) abandon(err error) {
	c := a.c
	c.pmu.Lock()
	ok := a.takeLocked()
	c.pmu.Unlock()
	if ok {
		a.finish(nil, err)
	}
}

func (a *asyncCall) expire() {
	a.abandon(a.deadlineErr())
}

func (a *asyncCall) deadlineErr() error {
	return fmt.Errorf("invoke %s on %s: %w", a.code, a.c.raddr, context.DeadlineExceeded)
}

// maxDeadlineLanes bounds the lanes of a connection; a call whose timeout has none gets a
// timer of its own.
const maxDeadlineLanes = 4

// deadlineLane expires the InvokeAsync calls of one connection made with one timeout.
// Their deadlines come in the order the calls were made, so one timer, armed for the oldest
// call still pending, serves them all: a runtime timer per call (set, then stopped by the
// answer) was 3 % of a producer's CPU. Answers mostly come in order, and each pops the
// calls ended at the head; a call that is never answered is popped by the timer.
type deadlineLane struct {
	c       *Conn
	timeout time.Duration
	q       []laneEntry // guarded by pmu: FIFO from head, by deadline
	head    int         // guarded by pmu
	timer   *time.Timer // created on first use
	armed   bool        // guarded by pmu: the timer will fire
}

// laneEntry is a call in a lane, and which use of it (asyncCall.gen): a call that finished
// may be in use again, for another deadline, while its old entry waits to be popped.
type laneEntry struct {
	a   *asyncCall
	gen uint64
}

// goneLocked reports whether the entry's call has left the pending table; pmu must be held.
func (e laneEntry) goneLocked() bool { return e.a.gen != e.gen || e.a.gone }

// laneLocked returns the connection's lane for timeout, making one if there are fewer than
// maxDeadlineLanes, or nil; pmu must be held.
func (c *Conn) laneLocked(timeout time.Duration) *deadlineLane {
	for _, l := range c.lanes {
		if l.timeout == timeout {
			return l
		}
	}
	if len(c.lanes) == maxDeadlineLanes {
		return nil
	}
	l := &deadlineLane{c: c, timeout: timeout}
	c.lanes = append(c.lanes, l)
	return l
}

// addLocked queues a, whose deadline is now + the lane's timeout; pmu must be held.
func (l *deadlineLane) addLocked(a *asyncCall, now time.Time) {
	a.lane, a.deadline = l, now.Add(l.timeout)
	l.q = append(l.q, laneEntry{a: a, gen: a.gen})
	if l.armed {
		return // for an earlier deadline: it fires, then arms for the next
	}
	l.armed = true
	if l.timer == nil {
		l.timer = time.AfterFunc(l.timeout, l.expire)
	} else {
		l.timer.Reset(l.timeout)
	}
}

// trimLocked pops the calls that have left the pending table from the head; pmu must be
// held.
func (l *deadlineLane) trimLocked() {
	for l.head < len(l.q) && l.q[l.head].goneLocked() {
		l.q[l.head] = laneEntry{}
		l.head++
	}
	l.compactLocked()
}

func (l *deadlineLane) compactLocked() {
	switch {
	case l.head == len(l.q):
		l.q, l.head = l.q[:0], 0
	case l.head >= 256 && 2*l.head >= len(l.q):
		// Never empty under a steady load: move the pending ones down rather than grow.
		n := copy(l.q, l.q[l.head:])
		clear(l.q[n:])
		l.q, l.head = l.q[:n], 0
	}
}

// expire is the lane's timer: it fails the calls whose deadline has passed and arms the
// timer for the next one.
func (l *deadlineLane) expire() {
	c := l.c
	var expired []*asyncCall
	c.pmu.Lock()
	l.armed = false
	if c.pending == nil { // closed: the close fails the calls
		c.pmu.Unlock()
		return
	}
	now := time.Now()
	for l.head < len(l.q) {
		e := l.q[l.head]
		if !e.goneLocked() {
			a := e.a
			if a.deadline.After(now) {
				break
			}
			if a.takeLocked() {
				expired = append(expired, a)
			}
		}
		l.q[l.head] = laneEntry{}
		l.head++
	}
	l.compactLocked()
	if l.head < len(l.q) {
		l.armed = true
		l.timer.Reset(l.q[l.head].a.deadline.Sub(now))
	}
	c.pmu.Unlock()
	for _, a := range expired {
		a.finish(nil, a.deadlineErr())
	}
}

// stopLanesLocked stops the lanes' timers at the close; pmu must be held.
func (c *Conn) stopLanesLocked() {
	for _, l := range c.lanes {
		if l.timer != nil {
			l.timer.Stop()
		}
		clear(l.q)
		l.q, l.head, l.armed = nil, 0, false
	}
}

// InvokeAsync sends req and returns without waiting for its response, or even for its write:
// done is called once with the response, or with an error when timeout passes first
// (wrapping context.DeadlineExceeded), when ctx ends first (wrapping its error), or when the
// connection closes (wrapping ErrConnClosed). A response that arrives later is dropped.
// timeout <= 0 means none beyond ctx.
//
// When InvokeAsync returns an error, nothing was sent and done is not called. Otherwise done
// runs on the connection's read goroutine (for a response, or the close: a Client's Close
// thus returns after it), or on a goroutine of the runtime (timeout, ctx): it must not
// block, and should hand any real work elsewhere. It may call InvokeAsync.
//
// Like Invoke, it sets req's opaque, flags and serialize type. The frame is queued for the
// connection's flusher, so requests sent in a row leave gathered in few writes. req, body
// included, is encoded into the frame before InvokeAsync returns: the caller may then reuse
// the body's buffer.
func (c *Conn) InvokeAsync(ctx context.Context, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) error {
	_, err := c.invokeAsync(ctx, req, timeout, asyncFunc(done), false)
	return err
}

// InvokeAsyncRaw is InvokeAsync that hands the outcome to r, and the response as read: the
// header fields of a response with a binary (ROCKETMQ) header come in RawExt, ExtFields nil
// (read them with protocol.Command.Ext or a typed decoder such as
// protocol.DecodeSendResponse). A caller making one call per message saves the map and the
// closure of each. The response is the receiver's only until InvokeDone returns: the
// connection decodes the next response into the same Command. What InvokeDone read from it
// stays valid (its strings are the receiver's, and a body is its own copy).
func (c *Conn) InvokeAsyncRaw(ctx context.Context, req *protocol.Command, timeout time.Duration, r AsyncReceiver) error {
	_, err := c.invokeAsync(ctx, req, timeout, r, true)
	return err
}

func (c *Conn) invokeAsync(ctx context.Context, req *protocol.Command, timeout time.Duration, r AsyncReceiver, raw bool) (sent bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("invoke %s on %s: %w", req.RequestCode(), c.raddr, err)
	}
	c.pmu.Lock()
	if c.pending == nil {
		c.pmu.Unlock()
		return false, fmt.Errorf("invoke %s: %w", req.RequestCode(), c.err) // set before pending was cleared
	}
	a := c.newCallLocked(req.RequestCode(), r, raw)
	opaque, gen := c.nextOpaqueLocked(), a.gen
	a.opaque = opaque
	c.pending[opaque] = pendingCall{async: a}
	if timeout > 0 {
		if l := c.laneLocked(timeout); l != nil {
			l.addLocked(a, time.Now())
		} else {
			a.timer, a.pooled = time.AfterFunc(timeout, a.expire), false
		}
	}
	if ctx.Done() != nil {
		c.watchLocked(ctx, a)
	}
	c.pmu.Unlock()
	// From here a may be finished and reused by another call at any time (its deadline,
	// its context, the close): it is read again only under pmu, for this use (gen).

	req.Opaque = opaque
	req.Flag &^= protocol.FlagResponse | protocol.FlagOneway
	req.Serialize = protocol.SerializeType(c.serialize.Load())
	if err := c.queueCommand(req); err != nil {
		c.pmu.Lock()
		mine := a.gen == gen && a.takeLocked()
		timer := a.timer
		c.pmu.Unlock()
		if !mine {
			// Its deadline, its context or the close took it first and calls done.
			return true, nil
		}
		if timer != nil {
			timer.Stop()
		}
		return false, fmt.Errorf("invoke %s: %w", req.RequestCode(), err)
	}
	return true, nil
}

// InvokeAsync sends req to addr and calls done with the outcome; see Conn.InvokeAsync. Only
// reaching a connection waits: on the first call to addr, for the dial, bounded by ctx. A
// connection found closed before anything was queued is redialed once.
func (cl *Client) InvokeAsync(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, done func(*protocol.Command, error)) error {
	return cl.invokeAsync(ctx, addr, req, timeout, asyncFunc(done), false)
}

// InvokeAsyncRaw is InvokeAsync with the outcome handed to r and the response as read; see
// Conn.InvokeAsyncRaw.
func (cl *Client) InvokeAsyncRaw(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, r AsyncReceiver) error {
	return cl.invokeAsync(ctx, addr, req, timeout, r, true)
}

func (cl *Client) invokeAsync(ctx context.Context, addr string, req *protocol.Command, timeout time.Duration, r AsyncReceiver, raw bool) error {
	for attempt := 0; ; attempt++ {
		c, err := cl.Conn(ctx, addr)
		if err != nil {
			return err
		}
		sent, err := c.invokeAsync(ctx, req, timeout, r, raw)
		if err != nil && !sent && attempt == 0 && errors.Is(err, ErrConnClosed) {
			continue
		}
		return err
	}
}
