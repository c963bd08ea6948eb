package producer

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// Unbatched SendAsync without a goroutine per send. The request is queued on the broker
// connection (remoting.Conn.InvokeAsync) and the caller returns; the broker's answer is read
// by the connection's read goroutine, which hands the callback to the producer's callback
// goroutines (callbacks); the send's slot is freed once the callback returned. Only a send
// that must be retried gets a goroutine of its own, for its further attempts, and so does one
// whose topic route or broker address is not cached yet (it may wait for the name servers).

// asyncSend is one unbatched SendAsync whose first attempt is in flight.
type asyncSend struct {
	p      *Producer
	ctx    context.Context
	pm     *prepared // &pmv
	done   func(SendResult, error)
	queues []MessageQueue
	mq     MessageQueue
	addr   string
	start  time.Time
	// refs counts who still uses the send: its SendAsync until InvokeAsyncRaw returned (a
	// deadline may end the call while the request is still being encoded), and its outcome
	// until handed on. The last one pools it (release).
	refs atomic.Int32
	// pmv and req are the message and the first attempt's request, in the same allocation.
	pmv prepared
	req sendRequest
}

// sendAsyncDirect sends the admitted message (slot taken, counted in p.async) with
// InvokeAsyncRaw and reports true, when its topic's route and its broker's address are
// cached; otherwise it does nothing and reports false. It copies *pmv when it sends.
func (p *Producer) sendAsyncDirect(ctx context.Context, pmv *prepared, done func(SendResult, error)) bool {
	r, ok := p.cl.CachedRoute(pmv.msg.Topic)
	if !ok || len(r.PublishQueues) == 0 {
		return false
	}
	mq := p.cfg.selector.Select(pmv.msg, r.PublishQueues)
	addr, ok := r.BrokerAddr(mq.BrokerName)
	if !ok {
		return false
	}
	a, _ := p.sends.Get().(*asyncSend)
	if a == nil {
		a = new(asyncSend)
	}
	*a = asyncSend{p: p, ctx: ctx, pmv: *pmv, done: done, queues: r.PublishQueues, mq: mq, addr: addr, start: time.Now()}
	a.refs.Store(2)
	a.pm = &a.pmv
	a.req.init(p.sendHeader(mq, a.pm, a.start))
	a.req.cmd.Body = a.pm.body
	if err := p.cl.InvokeAsyncRaw(ctx, addr, &a.req.cmd, p.cfg.sendTimeout, a); err != nil {
		a.refs.Store(1) // InvokeDone is not called: this goroutine is the only user
		a.failed(fmt.Errorf("send to %s at %s: %w", mq, addr, err), false)
		return true
	}
	a.release()
	return true
}

// InvokeDone is the InvokeAsyncRaw callback: it runs on the connection's read goroutine, so
// it only reads the answer and hands the outcome on.
func (a *asyncSend) InvokeDone(resp *protocol.Command, err error) {
	if err != nil {
		a.failed(fmt.Errorf("send to %s at %s: %w", a.mq, a.addr, err), false)
		return
	}
	res, stored, err := sendResult(a.mq, a.addr, a.pm, resp)
	if err != nil {
		a.failed(err, stored)
		return
	}
	p, done := a.p, a.done
	a.release()
	p.completeAsync(done, res, nil)
}

// release ends one use of the send (refs) and hands it back to its producer's pool after the
// last: the send (its message, its request and the request's header, some 600 bytes) was the
// producer's largest allocation per message. Its result holds none of it (the message id is
// in the properties' string, the offset message id in the answer's). A send retried on a
// goroutine of its own is never released, only collected.
func (a *asyncSend) release() {
	if a.refs.Add(-1) != 0 {
		return
	}
	p := a.p
	*a = asyncSend{}
	p.sends.Put(a)
}

// failed ends the send with err, or, when another attempt may succeed, makes the further
// attempts on a goroutine of their own, as Send would, within what is left of the send
// timeout.
func (a *asyncSend) failed(err error, stored bool) {
	p := a.p
	deadline := a.start.Add(p.cfg.sendTimeout)
	if stored || !retriable(err) || a.ctx.Err() != nil || p.cfg.retries == 0 || !time.Now().Before(deadline) {
		done, err := a.done, fmt.Errorf("send to topic %q (1 attempts): %w", a.pm.msg.Topic, err)
		a.release()
		p.completeAsync(done, SendResult{}, err)
		return
	}
	p.log.Debug("send failed, retrying", "queue", a.mq.String(), "attempt", 1, "err", err)
	go func() {
		ctx, cancel := context.WithDeadline(a.ctx, deadline)
		defer cancel()
		res, err := p.sendAttempts(ctx, a.pm, a.queues, 1, a.mq, err)
		p.completeAsync(a.done, res, err)
	}()
}

// completeAsync ends one asynchronous send: it queues done for the callback goroutines. The
// send keeps its slot until done returned (runCallback), so that the callbacks waiting to run
// count against WithMaxInFlightAsync, as the sends waiting for an answer do.
func (p *Producer) completeAsync(done func(SendResult, error), res SendResult, err error) {
	p.callbacks.push(asyncDone{p: p, done: done, res: res, err: err})
}

// asyncDone is a callback to run, with its outcome, or the callbacks of a batch's messages
// (batch set, done nil), which run one after another, each with its own result drawn from
// res, the answer to the whole batch, or with err.
type asyncDone struct {
	p     *Producer
	done  func(SendResult, error)
	batch *asyncBatch
	res   SendResult
	err   error
}

// runCallback calls the callback done of an admitted asynchronous send, then frees the send's
// slot and ends its count in p.async. A SendAsync that done makes when no slot is free may
// take the slot over instead (callbacks.lend): it is then that send's, and stays taken.
// SendAsync recognises a callback by this function's frame on its stack (see inCallback),
// hence noinline.
//
//go:noinline
func runCallback(p *Producer, done func(SendResult, error), res SendResult, err error) {
	p.callbacks.calling.Add(1 << 32)
	defer func() { // deferred: a callback on the caller's goroutine may panic and be recovered
		if !p.callbacks.returned() {
			<-p.asyncSlots
		}
		p.async.Done()
	}()
	done(res, err)
}

// maxCallbackGoroutines bounds the goroutines a producer runs SendAsync callbacks on.
const maxCallbackGoroutines = 4

// callbacks runs the callbacks of completed SendAsync calls on a few goroutines that it
// keeps, in the order the sends completed; with more than one goroutine, callbacks of
// different sends may run at the same time. Connections' read goroutines hand callbacks here
// rather than run them: a callback may block (it may call SendAsync, which waits for a slot),
// and the read goroutine must go on reading the answers that free slots. The queue is bounded
// by WithMaxInFlightAsync: each send queues one callback and holds its slot until the callback
// returned.
type callbacks struct {
	mu      sync.Mutex
	cond    sync.Cond   // signalled when a callback is queued or the queue is stopped
	queue   []asyncDone // guarded by mu: FIFO from head
	head    int         // guarded by mu
	running int         // guarded by mu: goroutines started and not ended
	idle    int         // guarded by mu: of those, how many wait for a callback
	stopped bool        // guarded by mu: goroutines end once the queue is empty

	// calling counts, in its high 32 bits, the callbacks running (runCallback) and, in its
	// low 32 bits, how many of their slots SendAsync calls they made have taken over (lend).
	// One word, so that a lend and a return never race: a running callback's slot is either
	// still its own or lent, never both.
	calling atomic.Uint64
}

// lend takes over the slot of a running callback, for a SendAsync that found no slot free,
// when that SendAsync is made by a callback (one whose slot is not lent yet, or another
// running one's: slots are alike). Without this, a callback that sends would wait for a slot
// while holding one, and with every slot so held nothing would ever free one.
func (cb *callbacks) lend() bool {
	v := cb.calling.Load()
	if v>>32 <= v&(1<<32-1) || !inCallback() {
		return false // no running callback still holds its slot, or the caller is not one
	}
	for ; v>>32 > v&(1<<32-1); v = cb.calling.Load() {
		if cb.calling.CompareAndSwap(v, v+1) {
			return true
		}
	}
	return false
}

// returned records that a running callback returned, and reports whether its slot (or that of
// another running one: slots are alike) was lent, in which case it must not be freed: a send
// holds it now.
func (cb *callbacks) returned() (lent bool) {
	for {
		v := cb.calling.Load()
		nv := v - 1<<32
		if lent = v&(1<<32-1) > 0; lent {
			nv--
		}
		if cb.calling.CompareAndSwap(v, nv) {
			return lent
		}
	}
}

// inCallback reports whether the calling goroutine runs a SendAsync callback: whether
// runCallback is on its stack. Only a SendAsync that found no slot free asks.
func inCallback() bool {
	entry := reflect.ValueOf(runCallback).Pointer()
	var buf [64]uintptr
	pcs := buf[:]
	for {
		n := runtime.Callers(2, pcs)
		if n == len(pcs) {
			pcs = make([]uintptr, 2*len(pcs)) // a deep stack: look at all of it
			continue
		}
		frames := runtime.CallersFrames(pcs[:n])
		for {
			f, more := frames.Next()
			if f.Entry == entry {
				return true
			}
			if !more {
				return false
			}
		}
	}
}

func (cb *callbacks) push(d asyncDone) {
	cb.mu.Lock()
	if cb.stopped {
		cb.mu.Unlock()
		late := d     // only this branch moves its copy to the heap
		go late.run() // a send that completed after Close stopped the goroutines
		return
	}
	if cb.head >= 256 && 2*cb.head >= len(cb.queue) {
		// Never drained under a steady load: move the waiting ones down rather than grow.
		n := copy(cb.queue, cb.queue[cb.head:])
		clear(cb.queue[n:])
		cb.queue, cb.head = cb.queue[:n], 0
	}
	cb.queue = append(cb.queue, d)
	switch {
	case cb.idle > 0:
		cb.cond.Signal()
	case cb.running < maxCallbackGoroutines:
		cb.running++
		go cb.work()
	}
	cb.mu.Unlock()
}

func (d *asyncDone) run() {
	if d.batch != nil {
		d.batch.runCallbacks(d.res, d.err)
		return
	}
	runCallback(d.p, d.done, d.res, d.err)
}

func (cb *callbacks) work() {
	cb.mu.Lock()
	for {
		for cb.head == len(cb.queue) {
			if cb.head > 0 {
				clear(cb.queue)
				cb.queue, cb.head = cb.queue[:0], 0
			}
			if cb.stopped {
				cb.running--
				cb.mu.Unlock()
				return
			}
			cb.idle++
			cb.cond.Wait()
			cb.idle--
		}
		d := cb.queue[cb.head]
		cb.queue[cb.head] = asyncDone{}
		cb.head++
		cb.mu.Unlock()
		d.run()
		cb.mu.Lock()
	}
}

// stop makes the goroutines end once they have run every callback queued; callbacks queued
// later run on goroutines of their own.
func (cb *callbacks) stop() {
	cb.mu.Lock()
	cb.stopped = true
	cb.cond.Broadcast()
	cb.mu.Unlock()
}
