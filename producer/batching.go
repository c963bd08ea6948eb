package producer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// Asynchronous batching (WithAsyncBatching) gathers SendAsync messages per queue into
// SEND_BATCH_MESSAGE requests: one request, one broker write and one answer carry many
// messages.
//
// Each queue has at most WithAsyncBatchesInFlight batches in flight (handed to the broker
// connection and not yet finished, retries included). With nothing of its queue in flight, a
// batch leaves at once when the linger is 0, so a lone message waits for nothing, or once the
// linger has passed since its first message. While some are in flight, the next batch gathers:
// it leaves once they have all finished, or, with room in flight, once it is half full
// (earlyLeaveLocked) or its linger has passed; a batch that fills up (count or bytes) waits for
// room behind the others closed before it. The batch size thus follows the load, and a busy
// queue has a batch gathering while one or more are on their way.
//
// No goroutine waits for a batch: it is handed to the connection with InvokeAsync, and its
// answer, read on the connection's read goroutine, queues its messages' callbacks for the
// producer's callback goroutines as one entry (they run in the batch's order, one after
// another, each message's slot freed once its callback returned), and hands the queue's next
// batch, if one is waiting, to the connection. Only a batch that must be retried, or resent
// message by message, gets a goroutine.
//
// # Order
//
// One goroutine at a time hands a queue's batches to the connection (the one holding the
// queue's turn, batchQueue.sending), in the order they were closed, which is the order their
// messages were given; the connection writes its requests in the order they were queued. So
// the batches of a queue reach the broker in order. A broker that serves one connection's
// sends one after another stores them in that order: flowd does in asynchronous-flush mode
// (sends are served on the connection's read goroutine), and so does RocketMQ's broker with
// its default of one send thread. Several batches in flight may be stored in another order
// when the broker serves them concurrently (flowd in SYNC_FLUSH mode, or while it rolls a
// commit-log segment), and when one of them is retried, or resent message by message, while
// later ones are stored. With one batch in flight per queue (the default for a selector that
// keeps order), a batch leaves only once the one before it has finished, so the order holds
// in every case.

// asyncBatcher holds the batches of each queue.
type asyncBatcher struct {
	maxCount    int
	maxBytes    int
	linger      time.Duration
	maxInFlight int // per queue

	bufs    sync.Pool // *[]byte: batch encode buffers
	batches sync.Pool // *asyncBatch, with its items' backing array

	mu     sync.Mutex
	queues map[MessageQueue]*batchQueue // guarded by mu: queues with a batch open, waiting or in flight
	gen    uint64                       // guarded by mu: numbers the batches, for their linger timers
}

// batchQueue is one queue's batches. Every field is guarded by the batcher's mu.
type batchQueue struct {
	mq       MessageQueue
	open     *asyncBatch   // the batch still taking messages, or nil
	ready    []*asyncBatch // closed batches waiting for room in flight, oldest first
	inFlight int           // batches handed to the connection and not yet finished
	// sending is the queue's turn to hand ready batches to the connection: whoever set it
	// sends them, in order, until none may leave.
	sending bool
}

// idle reports whether q holds nothing, so that it can leave the batcher's map.
func (q *batchQueue) idle() bool {
	return q.open == nil && len(q.ready) == 0 && q.inFlight == 0 && !q.sending
}

// asyncBatch is a batch being gathered, waiting, or in flight.
type asyncBatch struct {
	p     *Producer
	q     *batchQueue
	gen   uint64 // set under the batcher's mu when the batch is opened
	items []asyncItem
	bytes int
	timer *time.Timer // the linger; nil when none is armed
	// lingered: the linger passed while there was no room in flight; the batch leaves as soon
	// as there is.
	lingered bool

	// The send in flight. Its request is allocated apart, per send: once handed to
	// InvokeAsync it is never written again (the batch is recycled, the request is not).
	start time.Time
	addr  string
	pm    prepared // the batch as one send (a lone message's own, copied)
}

// asyncItem is one SendAsync message in a batch, prepared message included (kept by value:
// no allocation of its own).
type asyncItem struct {
	ctx  context.Context
	pm   prepared
	done func(SendResult, error)
}

// batchEntryOverhead is what a batch entry adds to its body and properties: RocketMQ's
// fixed entry fields.
const batchEntryOverhead = 4 + 4 + 4 + 4 + 4 + 2

func (pm *prepared) batchSize() int { return batchEntryOverhead + len(pm.msg.Body) + len(pm.props) }

// earlyLeaveLocked reports whether q's open batch ob may leave while other batches of q are
// in flight (fewer than the bound), rather than wait for them to finish: once it is half
// full, where full is maxBytes, or maxCount capped by the queue's part of the sends in flight
// (WithMaxInFlightAsync shared evenly among the queues with batches), which is as many
// messages as a batch of the queue can gather. A batch that left with its first message
// would make every batch small once several may be in flight; half full keeps batches large
// (the cost of a request is mostly per request, on both sides) while the next one overlaps
// the round trip of the one before.
func (b *asyncBatcher) earlyLeaveLocked(p *Producer, ob *asyncBatch) bool {
	full := min(b.maxCount, cap(p.asyncSlots)/max(len(b.queues), 1))
	return len(ob.items) >= max(1, full/2) || ob.bytes >= b.maxBytes/2
}

func newAsyncBatcher(cfg *config) *asyncBatcher {
	n := cfg.batchInFlight
	if n == 0 {
		n = DefaultAsyncBatchesInFlight
		if os, ok := cfg.selector.(OrderedSelector); ok && os.Ordered() {
			n = 1
		}
	}
	return &asyncBatcher{
		maxCount: cfg.batchCount, maxBytes: min(cfg.batchBytes, cfg.maxMessageSize), linger: cfg.batchLinger,
		maxInFlight: n, queues: make(map[MessageQueue]*batchQueue),
	}
}

// batchable reports whether msg may join a batch: a batch stores its entries as they are, so a
// body that would be compressed, and a delayed message, travel alone. (A batchable message is
// thus prepared, and its body kept, as it would be for a batch.)
func (p *Producer) batchable(msg *Message) bool {
	return p.batcher != nil && msg != nil && msg.DelayLevel == 0 && len(msg.Body) <= p.cfg.compressOver
}

// enqueueAsync adds an admitted SendAsync message (slot taken, counted in p.async) to its
// queue's batch. The queue is chosen now, by the selector, so that an ordered selector's
// choice holds; finding it may wait for the topic's route on the first send to a topic.
func (p *Producer) enqueueAsync(ctx context.Context, pm prepared, done func(SendResult, error)) {
	var queues []MessageQueue
	if r, ok := p.cl.CachedRoute(pm.msg.Topic); ok && len(r.PublishQueues) > 0 {
		queues = r.PublishQueues // the usual case: no context, no timer per message
	} else {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
		var err error
		queues, err = p.publishQueues(rctx, pm.msg.Topic)
		cancel()
		if err != nil {
			p.finishAsync(done, SendResult{}, err)
			return
		}
	}
	mq := p.cfg.selector.Select(pm.msg, queues)
	p.batcher.add(p, mq, &asyncItem{ctx: ctx, pm: pm, done: done})
}

// finishAsync ends one asynchronous send on the caller's goroutine: calls done, then frees
// its slot (runCallback).
func (p *Producer) finishAsync(done func(SendResult, error), res SendResult, err error) {
	runCallback(p, done, res, err)
}

func (b *asyncBatcher) add(p *Producer, mq MessageQueue, it *asyncItem) {
	size := it.pm.batchSize()
	b.mu.Lock()
	q := b.queues[mq]
	if q == nil {
		q = &batchQueue{mq: mq}
		b.queues[mq] = q
	}
	ob := q.open
	if ob != nil && (len(ob.items) >= b.maxCount || ob.bytes+size > b.maxBytes) {
		b.closeLocked(q)
		ob = nil
	}
	if ob == nil {
		ob = b.newBatchLocked(p, q)
		q.open = ob
	}
	ob.items = append(ob.items, *it)
	ob.bytes += size
	ahead := q.inFlight + len(q.ready)
	switch {
	case len(ob.items) >= b.maxCount || ob.bytes >= b.maxBytes:
		b.closeLocked(q)
	case ahead >= b.maxInFlight:
		// No room in flight: it gathers until a batch in flight finishes.
	case ahead > 0:
		if b.earlyLeaveLocked(p, ob) {
			b.closeLocked(q)
		}
	case b.linger == 0:
		b.closeLocked(q)
	}
	if q.open == ob && b.linger > 0 && ob.timer == nil && !ob.lingered {
		gen := ob.gen
		ob.timer = time.AfterFunc(b.linger, func() { b.lingerEnded(q, ob, gen) })
	}
	turn := b.takeTurnLocked(q)
	b.mu.Unlock()
	if turn {
		b.sendReady(q)
	}
}

// newBatchLocked returns an empty batch of q, recycled when one is at hand.
func (b *asyncBatcher) newBatchLocked(p *Producer, q *batchQueue) *asyncBatch {
	ab, _ := b.batches.Get().(*asyncBatch)
	if ab == nil {
		ab = &asyncBatch{items: make([]asyncItem, 0, min(b.maxCount, 64))}
	}
	b.gen++
	ab.p, ab.q, ab.gen = p, q, b.gen
	return ab
}

// recycle makes ab, whose messages were all answered, available to newBatchLocked. It leaves
// gen alone, which only changes under the batcher's lock: a linger timer that fires late
// compares it (see lingerEnded).
func (b *asyncBatcher) recycle(ab *asyncBatch) {
	clear(ab.items)
	ab.items = ab.items[:0]
	ab.p, ab.q, ab.bytes, ab.timer, ab.lingered = nil, nil, 0, nil, false
	ab.start, ab.addr, ab.pm = time.Time{}, "", prepared{}
	b.batches.Put(ab)
}

// closeLocked closes q's open batch: it takes no more messages and waits behind the closed
// batches of its queue for room in flight.
func (b *asyncBatcher) closeLocked(q *batchQueue) {
	ob := q.open
	if ob.timer != nil {
		ob.timer.Stop()
		ob.timer = nil
	}
	q.open = nil
	q.ready = append(q.ready, ob)
}

// takeTurnLocked reports whether a batch of q may leave now and nobody else is sending q's
// batches; the caller then holds q's turn and must call sendReady.
func (b *asyncBatcher) takeTurnLocked(q *batchQueue) bool {
	if q.sending || len(q.ready) == 0 || q.inFlight >= b.maxInFlight {
		return false
	}
	q.sending = true
	return true
}

// sendReady hands q's ready batches to the connection, oldest first, while there is room in
// flight; the caller holds q's turn, which it gives up on return.
func (b *asyncBatcher) sendReady(q *batchQueue) {
	for {
		b.mu.Lock()
		if len(q.ready) == 0 || q.inFlight >= b.maxInFlight {
			q.sending = false
			if q.idle() {
				delete(b.queues, q.mq)
			}
			b.mu.Unlock()
			return
		}
		ab := q.ready[0]
		n := copy(q.ready, q.ready[1:]) // a short list: its array is kept
		q.ready[n] = nil
		q.ready = q.ready[:n]
		q.inFlight++
		b.mu.Unlock()
		ab.p.startBatch(ab)
	}
}

// lingerEnded closes q's batch ob, numbered gen, if it is still open, and sends it when there
// is room in flight (otherwise the end of a batch in flight does). It reads nothing of ob
// before knowing that ob is q's open batch: ob may have been sent and recycled meanwhile.
func (b *asyncBatcher) lingerEnded(q *batchQueue, ob *asyncBatch, gen uint64) {
	b.mu.Lock()
	if q.open != ob || ob.gen != gen {
		b.mu.Unlock()
		return
	}
	ob.timer = nil
	if q.inFlight+len(q.ready) < b.maxInFlight {
		b.closeLocked(q)
	} else {
		ob.lingered = true
	}
	turn := b.takeTurnLocked(q)
	b.mu.Unlock()
	if turn {
		b.sendReady(q)
	}
}

// finished records that a batch of q in flight has its outcome, and sends what may leave in
// its place: the oldest ready batch; the open one when nothing else of q is in flight (its
// gathering ends here), or when it may leave early, or its linger has passed.
func (b *asyncBatcher) finished(q *batchQueue) {
	b.mu.Lock()
	q.inFlight--
	if ob := q.open; ob != nil && (q.inFlight+len(q.ready) == 0 ||
		q.inFlight+len(q.ready) < b.maxInFlight && (ob.lingered || b.earlyLeaveLocked(ob.p, ob))) {
		b.closeLocked(q)
	}
	turn := b.takeTurnLocked(q)
	if !turn && q.idle() {
		delete(b.queues, q.mq)
	}
	b.mu.Unlock()
	if turn {
		b.sendReady(q)
	}
}

// startBatch sends ab, just taken off its queue's ready list and counted in flight: a lone
// message as itself, several as one SEND_BATCH_MESSAGE. Messages whose context ended are
// answered with its error first.
func (p *Producer) startBatch(ab *asyncBatch) {
	mq := ab.q.mq
	live := ab.items[:0]
	for _, it := range ab.items {
		if err := it.ctx.Err(); err != nil {
			p.completeAsync(it.done, SendResult{}, fmt.Errorf("send to topic %q: %w", mq.Topic, err))
			continue
		}
		live = append(live, it)
	}
	clear(ab.items[len(live):])
	ab.items = live
	if len(live) == 0 {
		p.batcher.finished(ab.q)
		p.batcher.recycle(ab)
		return
	}
	ab.start = time.Now()
	ctx := context.Background() // a batch is not bound by any one caller's context, whose end was checked
	if len(live) == 1 {
		ctx = live[0].ctx
	}
	addr, ok := p.cachedBrokerAddr(mq)
	if !ok {
		// Not known yet (or forgotten): the synchronous path finds it, on a goroutine.
		go ab.retry(errors.New("broker address not cached"), 0)
		return
	}
	ab.addr = addr
	var bp *[]byte
	if len(live) == 1 {
		ab.pm = live[0].pm
	} else {
		var err error
		if bp, err = ab.encode(); err != nil {
			p.completeBatch(ab, SendResult{}, fmt.Errorf("send to topic %q in a batch of %d: %w: %w", mq.Topic, len(live), ErrMessageTooLarge, err))
			return
		}
	}
	req := p.newSendRequest(mq, &ab.pm)
	// The batch itself receives the answer (no method value per send), read raw.
	err := p.cl.InvokeAsyncRaw(ctx, addr, req, p.cfg.sendTimeout, ab)
	// InvokeAsync encoded the request, body included, before it returned: the buffer may
	// serve another batch. The answer may have come already, and ab be recycled: ab is not
	// touched again unless InvokeAsync failed, in which case its callback is not called.
	if bp != nil {
		p.batcher.putBuf(bp)
	}
	if err != nil {
		ab.failed(fmt.Errorf("send to %s at %s: %w", mq, addr, err), false)
	}
}

// cachedBrokerAddr is the address of mq's broker when its topic's route is cached.
func (p *Producer) cachedBrokerAddr(mq MessageQueue) (string, bool) {
	r, ok := p.cl.CachedRoute(mq.Topic)
	if !ok {
		return "", false
	}
	return r.BrokerAddr(mq.BrokerName)
}

// encode sets ab.pm to ab's messages as one batch send, its body in a pooled buffer, which it
// returns for putBuf once the body is no longer needed.
func (ab *asyncBatch) encode() (*[]byte, error) {
	b := ab.p.batcher
	bp, _ := b.bufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	body, err := appendBatch((*bp)[:0], ab.items)
	if err != nil {
		b.putBuf(bp)
		return nil, err
	}
	*bp = body
	ab.pm = prepared{msg: ab.items[0].pm.msg, body: body, batch: true}
	return bp, nil
}

// maxPooledBatchBuf is the largest encode buffer kept for reuse.
const maxPooledBatchBuf = 1 << 20

func (b *asyncBatcher) putBuf(bp *[]byte) {
	if cap(*bp) > maxPooledBatchBuf {
		return
	}
	*bp = (*bp)[:0]
	b.bufs.Put(bp)
}

// appendBatch appends items as a SEND_BATCH_MESSAGE body to dst, each entry with the
// properties string its message was prepared with (encoded once, in prepare) and its
// uncompressed body.
func appendBatch(dst []byte, items []asyncItem) ([]byte, error) {
	n := 0
	for i := range items {
		n += items[i].pm.batchSize()
	}
	if n > protocol.MaxFrameSize {
		return dst, fmt.Errorf("encode batch: %d bytes exceeds %d: %w", n, protocol.MaxFrameSize, protocol.ErrFrameTooLarge)
	}
	dst = grow(dst, n)
	var err error
	for i := range items {
		pm := &items[i].pm
		if dst, err = protocol.AppendBatchEntryEncoded(dst, pm.msg.Flag, pm.msg.Body, pm.props); err != nil {
			return dst, fmt.Errorf("message %d: %w", i, err)
		}
	}
	return dst, nil
}

// grow returns b with room for n more bytes.
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b
	}
	nb := make([]byte, len(b), len(b)+n)
	copy(nb, b)
	return nb
}

// InvokeDone is the InvokeAsyncRaw callback: it runs on the connection's read goroutine.
func (ab *asyncBatch) InvokeDone(resp *protocol.Command, err error) {
	mq := ab.q.mq
	if err != nil {
		ab.failed(fmt.Errorf("send to %s at %s: %w", mq, ab.addr, err), false)
		return
	}
	res, stored, err := sendResult(mq, ab.addr, &ab.pm, resp)
	if err != nil {
		ab.failed(err, stored)
		return
	}
	ab.p.completeBatch(ab, res, nil)
}

// failed handles the failure err of ab's first attempt: it ends the batch with err, or, when
// another attempt may succeed, makes the further attempts on a goroutine. stored says the
// broker stored the batch but its answer is unreadable: it is never sent again.
func (ab *asyncBatch) failed(err error, stored bool) {
	p := ab.p
	if stored {
		p.completeBatch(ab, SendResult{}, fmt.Errorf("send to %s (1 attempts): %w: %w", ab.q.mq, errStoredUnreadable, err))
		return
	}
	var be *clientcore.BrokerError
	refused := len(ab.items) > 1 && errors.As(err, &be) && !retriable(err)
	if !refused && (!retriable(err) || p.cfg.retries == 0 || !time.Now().Before(ab.start.Add(p.cfg.sendTimeout)) ||
		(len(ab.items) == 1 && ab.items[0].ctx.Err() != nil)) {
		p.completeBatch(ab, SendResult{}, fmt.Errorf("send to %s (1 attempts): %w", ab.q.mq, err))
		return
	}
	go ab.retry(err, 1)
}

// retry makes the attempts of ab from the from-th on (0: all of them), the earlier ones having
// failed with lastErr, on the same queue (the batcher chose it, perhaps for order), within
// what is left of the send timeout; it runs on a goroutine of its own. A batch the broker
// refused as a whole (one message too large for it, say) stored nothing: each of its messages
// is then sent alone and gets its own answer.
func (ab *asyncBatch) retry(lastErr error, from int) {
	p := ab.p
	mq := ab.q.mq
	if ab.start.IsZero() {
		ab.start = time.Now()
	}
	ctx, cancel := context.WithDeadline(context.Background(), ab.start.Add(p.cfg.sendTimeout))
	defer cancel()
	var be *clientcore.BrokerError
	if len(ab.items) > 1 && errors.As(lastErr, &be) && !retriable(lastErr) {
		p.log.Debug("batch refused, sending its messages one by one", "queue", mq.String(), "messages", len(ab.items), "err", lastErr)
		for i := range ab.items {
			it := &ab.items[i]
			res, err := p.sendToQueue(it.ctx, mq, &it.pm)
			p.completeAsync(it.done, res, err)
		}
		p.batcher.finished(ab.q) // only now: with one batch in flight, order holds
		p.batcher.recycle(ab)
		return
	}
	if len(ab.items) == 1 {
		var cancelItem context.CancelFunc
		ctx, cancelItem = context.WithDeadline(ab.items[0].ctx, ab.start.Add(p.cfg.sendTimeout))
		defer cancelItem()
		ab.pm = ab.items[0].pm
		res, err := p.attemptsOnQueue(ctx, mq, &ab.pm, from, lastErr)
		p.completeBatch(ab, res, err)
		return
	}
	bp, err := ab.encode()
	if err != nil {
		p.completeBatch(ab, SendResult{}, fmt.Errorf("%w: %w", ErrMessageTooLarge, err))
		return
	}
	res, err := p.attemptsOnQueue(ctx, mq, &ab.pm, from, lastErr)
	ab.pm.body = nil
	p.batcher.putBuf(bp)
	if err != nil && errors.As(err, &be) && !retriable(err) && !errors.Is(err, errStoredUnreadable) {
		ab.retry(err, 0) // refused on a later attempt: message by message
		return
	}
	p.completeBatch(ab, res, err)
}

// completeBatch ends ab with the broker's answer res (one for the whole batch) or err: its
// queue's next batch may leave, and its messages' callbacks are queued as one entry, which
// frees each message's slot once its callback returned and recycles ab once they all ran.
func (p *Producer) completeBatch(ab *asyncBatch, res SendResult, err error) {
	p.batcher.finished(ab.q)
	if err != nil && len(ab.items) > 1 {
		err = fmt.Errorf("send to topic %q in a batch of %d: %w", ab.q.mq.Topic, len(ab.items), err)
	}
	p.callbacks.push(asyncDone{p: p, batch: ab, res: res, err: err})
}

// runCallbacks calls the callback of each of ab's messages, in order, with its own result
// drawn from res, the answer to the whole batch (or with err), and recycles ab.
func (ab *asyncBatch) runCallbacks(res SendResult, err error) {
	p := ab.p
	items := ab.items
	if len(items) == 1 {
		runCallback(p, items[0].done, res, err)
		p.batcher.recycle(ab)
		return
	}
	// The broker answers with the first message's queue offset and the messages' offset ids
	// joined with commas (RocketMQ's form); a broker that sends some other number of ids
	// leaves OffsetMsgID empty rather than guessing which is whose.
	ids := res.OffsetMsgID
	split := err == nil && strings.Count(ids, ",") == len(items)-1
	for i, it := range items {
		if err != nil {
			runCallback(p, it.done, SendResult{}, err)
			continue
		}
		r := SendResult{Status: res.Status, MsgID: it.pm.uniq, Queue: res.Queue, QueueOffset: res.QueueOffset + int64(i), TransactionID: res.TransactionID}
		if split {
			r.OffsetMsgID, ids, _ = strings.Cut(ids, ",")
		}
		runCallback(p, it.done, r, nil)
	}
	p.batcher.recycle(ab)
}

// errStoredUnreadable marks a send the broker stored but whose answer could not be read: it
// must not be sent again, alone or together.
var errStoredUnreadable = errors.New("stored, but the answer is unreadable")

// encodeBatch encodes pms as a SEND_BATCH_MESSAGE body (SendBatch's), each entry with the
// properties string its message was prepared with and its uncompressed body.
func encodeBatch(pms []*prepared) ([]byte, error) {
	n := 0
	for _, pm := range pms {
		n += pm.batchSize()
	}
	if n > protocol.MaxFrameSize {
		return nil, fmt.Errorf("encode batch: %d bytes exceeds %d: %w", n, protocol.MaxFrameSize, protocol.ErrFrameTooLarge)
	}
	b := make([]byte, 0, n)
	var err error
	for i, pm := range pms {
		if b, err = protocol.AppendBatchEntryEncoded(b, pm.msg.Flag, pm.msg.Body, pm.props); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
	}
	return b, nil
}

// sendToQueue sends pm to mq, retrying on the same queue (the batcher chose it, perhaps for
// order) failures after which nothing was stored, within the send timeout.
func (p *Producer) sendToQueue(ctx context.Context, mq MessageQueue, pm *prepared) (SendResult, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	return p.attemptsOnQueue(ctx, mq, pm, 0, nil)
}

// attemptsOnQueue makes pm's attempts on mq from the from-th on (0: all of them), within ctx;
// when from > 0 the last earlier one failed with lastErr.
func (p *Producer) attemptsOnQueue(ctx context.Context, mq MessageQueue, pm *prepared, from int, lastErr error) (SendResult, error) {
	attempts := from
	for attempt := from; attempt <= p.cfg.retries; attempt++ {
		if attempt > 0 {
			p.log.Debug("send failed, retrying", "queue", mq.String(), "attempt", attempt, "err", lastErr)
		}
		attempts++
		res, stored, err := p.sendTo(ctx, mq, pm)
		if err == nil {
			return res, nil
		}
		lastErr = err
		if stored {
			lastErr = fmt.Errorf("%w: %w", errStoredUnreadable, err)
			break
		}
		if !retriable(err) || ctx.Err() != nil {
			break
		}
	}
	return SendResult{}, fmt.Errorf("send to %s (%d attempts): %w", mq, attempts, lastErr)
}
