package producer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/client"
	"github.com/flowd-io/flowd/protocol"
)

// Asynchronous batching (WithAsyncBatching) gathers SendAsync messages per queue into
// SEND_BATCH_MESSAGE requests: one request, one broker write and one answer carry many
// messages.
//
// Each queue has at most one batch in flight, so that its batches are stored in the order
// their messages were given. While one is in flight, messages for the queue gather, and the
// next batch leaves when it is answered; a batch that fills up (count or bytes) meanwhile waits
// its turn behind it. With no batch in flight, a batch leaves at once when the linger is 0,
// so a lone message waits for nothing, or once the linger has passed since its first message.
// The batch size thus follows the load.

// asyncBatcher holds the batches of each queue.
type asyncBatcher struct {
	maxCount int
	maxBytes int
	linger   time.Duration

	mu       sync.Mutex
	open     map[MessageQueue]*asyncBatch   // guarded by mu: the batch still taking messages
	full     map[MessageQueue][]*asyncBatch // guarded by mu: closed batches waiting, oldest first
	inFlight map[MessageQueue]bool          // guarded by mu: a batch was sent and not yet answered
}

// asyncBatch is a batch being gathered.
type asyncBatch struct {
	mq    MessageQueue
	items []asyncItem
	bytes int
	timer *time.Timer // the linger; nil when none is armed
}

// asyncItem is one SendAsync message in a batch.
type asyncItem struct {
	ctx  context.Context
	pm   *prepared
	done func(SendResult, error)
}

// batchEntryOverhead is what a batch entry adds to its body and properties: RocketMQ's
// fixed entry fields.
const batchEntryOverhead = 4 + 4 + 4 + 4 + 4 + 2

func (pm *prepared) batchSize() int { return batchEntryOverhead + len(pm.msg.Body) + len(pm.props) }

// batchable reports whether msg may join a batch: a batch stores its entries as they are, so a
// body that would be compressed, and a delayed message, travel alone. (A batchable message is
// thus prepared, and its body kept, as it would be for a batch.)
func (p *Producer) batchable(msg *Message) bool {
	return p.batcher != nil && msg != nil && msg.DelayLevel == 0 && len(msg.Body) <= p.cfg.compressOver
}

// enqueueAsync adds an admitted SendAsync message (slot taken, counted in p.async) to its
// queue's batch. The queue is chosen now, by the selector, so that an ordered selector's
// choice holds; finding it may wait for the topic's route on the first send to a topic.
func (p *Producer) enqueueAsync(ctx context.Context, pm *prepared, done func(SendResult, error)) {
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
	p.batcher.add(p, mq, asyncItem{ctx: ctx, pm: pm, done: done})
}

// finishAsync ends one asynchronous send: frees its slot, then calls done.
func (p *Producer) finishAsync(done func(SendResult, error), res SendResult, err error) {
	defer p.async.Done()
	<-p.asyncSlots
	done(res, err)
}

func (b *asyncBatcher) add(p *Producer, mq MessageQueue, it asyncItem) {
	size := it.pm.batchSize()
	b.mu.Lock()
	ob := b.open[mq]
	if ob != nil && (len(ob.items) >= b.maxCount || ob.bytes+size > b.maxBytes) {
		b.closeLocked(ob)
		ob = nil
	}
	if ob == nil {
		ob = &asyncBatch{mq: mq}
		b.open[mq] = ob
	}
	ob.items = append(ob.items, it)
	ob.bytes += size
	isFull := len(ob.items) >= b.maxCount || ob.bytes >= b.maxBytes
	var ready *asyncBatch
	switch {
	case b.inFlight[mq]:
		if isFull {
			b.closeLocked(ob)
		}
	case isFull || b.linger == 0 || len(b.full[mq]) > 0:
		ready = b.nextLocked(mq)
	case ob.timer == nil:
		ob.timer = time.AfterFunc(b.linger, func() { b.lingerEnded(p, ob) })
	}
	b.mu.Unlock()
	if ready != nil {
		go p.sendAsyncBatch(ready)
	}
}

// closeLocked closes the open batch ob: it takes no more messages and waits behind the
// closed batches of its queue for its turn to be sent.
func (b *asyncBatcher) closeLocked(ob *asyncBatch) {
	if ob.timer != nil {
		ob.timer.Stop()
		ob.timer = nil
	}
	delete(b.open, ob.mq)
	b.full[ob.mq] = append(b.full[ob.mq], ob)
}

// nextLocked returns mq's next batch to send, the oldest closed one or else the open one,
// and marks mq in flight; nil, and mq not in flight, when there is none.
func (b *asyncBatcher) nextLocked(mq MessageQueue) *asyncBatch {
	var next *asyncBatch
	if q := b.full[mq]; len(q) > 0 {
		next = q[0]
		q[0] = nil
		if len(q) == 1 {
			delete(b.full, mq)
		} else {
			b.full[mq] = q[1:]
		}
	} else if ob := b.open[mq]; ob != nil {
		if ob.timer != nil {
			ob.timer.Stop()
			ob.timer = nil
		}
		delete(b.open, mq)
		next = ob
	}
	if next == nil {
		delete(b.inFlight, mq)
		return nil
	}
	b.inFlight[mq] = true
	return next
}

// lingerEnded sends ob if it is still open and nothing of its queue is in flight (else the
// answer to the batch in flight sends it).
func (b *asyncBatcher) lingerEnded(p *Producer, ob *asyncBatch) {
	b.mu.Lock()
	if b.open[ob.mq] != ob || b.inFlight[ob.mq] {
		b.mu.Unlock()
		return
	}
	ready := b.nextLocked(ob.mq)
	b.mu.Unlock()
	p.sendAsyncBatch(ready)
}

// sent records that mq's batch in flight was answered, and returns the queue's next batch,
// if any, now in flight in its place.
func (b *asyncBatcher) sent(mq MessageQueue) *asyncBatch {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.nextLocked(mq)
}

// sendAsyncBatch sends ab and reports each message's outcome to its own callback, then sends
// the queue's next batch if one gathered in the meantime.
func (p *Producer) sendAsyncBatch(ab *asyncBatch) {
	for ab != nil {
		p.deliverBatch(ab.mq, ab.items)
		ab = p.batcher.sent(ab.mq)
	}
}

func (p *Producer) deliverBatch(mq MessageQueue, items []asyncItem) {
	live := items[:0:0]
	for _, it := range items {
		if err := it.ctx.Err(); err != nil {
			p.finishAsync(it.done, SendResult{}, fmt.Errorf("send to topic %q: %w", mq.Topic, err))
			continue
		}
		live = append(live, it)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		res, err := p.sendToQueue(live[0].ctx, mq, live[0].pm)
		p.finishAsync(live[0].done, res, err)
		return
	}
	results, err := p.sendBatchTo(mq, live)
	var be *client.BrokerError
	if err != nil && errors.As(err, &be) && !errors.Is(err, errStoredUnreadable) {
		// The broker refused the batch as a whole (one message too large for it, say):
		// nothing was stored, so each message goes alone and gets its own answer.
		p.log.Debug("batch refused, sending its messages one by one", "queue", mq.String(), "messages", len(live), "err", err)
		for _, it := range live {
			res, err := p.sendToQueue(it.ctx, mq, it.pm)
			p.finishAsync(it.done, res, err)
		}
		return
	}
	for i, it := range live {
		if err != nil {
			p.finishAsync(it.done, SendResult{}, fmt.Errorf("send to topic %q in a batch of %d: %w", mq.Topic, len(live), err))
			continue
		}
		p.finishAsync(it.done, results[i], nil)
	}
}

// errStoredUnreadable marks a send the broker stored but whose answer could not be read: it
// must not be sent again, alone or together.
var errStoredUnreadable = errors.New("stored, but the answer is unreadable")

// sendBatchTo sends items as one SEND_BATCH_MESSAGE to mq, retrying on mq what the broker
// certainly did not store, within the send timeout.
func (p *Producer) sendBatchTo(mq MessageQueue, items []asyncItem) ([]SendResult, error) {
	pms := make([]*prepared, len(items))
	uniqs := make([]string, len(items))
	for i, it := range items {
		pms[i] = it.pm
		uniqs[i] = it.pm.uniq
	}
	body, err := encodeBatch(pms)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMessageTooLarge, err)
	}
	pm := &prepared{msg: items[0].pm.msg, uniq: joinUniqs(uniqs), body: body, batch: true}
	// The batch is its messages' send: it is not bound by any one caller's context, whose end
	// was checked before, but by the send timeout.
	res, err := p.sendToQueue(context.Background(), mq, pm)
	if err != nil {
		return nil, err
	}
	return splitBatchResult(res, uniqs), nil
}

// encodeBatch encodes pms as a SEND_BATCH_MESSAGE body, each entry with the properties
// string its message was prepared with (encoded once, in prepare) and its uncompressed body.
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

func joinUniqs(uniqs []string) string {
	n := len(uniqs) - 1
	for _, u := range uniqs {
		n += len(u)
	}
	b := make([]byte, 0, n)
	for i, u := range uniqs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, u...)
	}
	return string(b)
}

// sendToQueue sends pm to mq, retrying on the same queue (the batcher chose it, perhaps for
// order) failures after which nothing was stored, within the send timeout.
func (p *Producer) sendToQueue(ctx context.Context, mq MessageQueue, pm *prepared) (SendResult, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	var lastErr error
	attempts := 0
	for attempt := 0; attempt <= p.cfg.retries; attempt++ {
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
