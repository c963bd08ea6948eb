package consumer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// pullResult is what one pull brought back.
type pullResult struct {
	code      protocol.ResponseCode
	requested int64 // the offset pulled from
	next      int64
	suggest   int64 // the member the broker suggests for the next pull (suggestWhichBrokerId)
	msgs      []*Message
	bytes     int64
}

// pullTask pulls one owned queue until the queue is dropped or the consumer shuts down: one
// pull in flight per queue, and with WithPullGoroutines at most that many across all tasks.
//
// # Notes
//
// A pull's answer is decoded and cached by the pull's callback, on the connection's read
// goroutine (startPull), which then wakes Poll: the messages reach Poll with one goroutine
// hand-off, not three (read goroutine, pull goroutine, this task, Poll). The task only
// learns afterwards that it may send the next pull.
//
// A pull the broker parks (long polling) cannot be withdrawn: RocketMQ's protocol has no
// cancel, so the broker keeps it until a message arrives or the suspend time runs out, and it
// counts against the connection's limit of requests in flight (past which the broker answers
// SYSTEM_BUSY to everything, heartbeats included). So a pull is never abandoned at the broker
// blindly: when a seek or a drop makes its answer useless, the task stops waiting for it but
// its goroutine waits on (the answer is discarded), and while a queue has such a pull parked,
// its next pulls are sent without the suspend flag, paced by the flow-control delay. Each
// queue thus has at most one parked pull, however often it is seeked, dropped and re-added.
func (l *LitePull) pullTask(ctx context.Context, q *queue) {
	defer l.wg.Done()
	for ctx.Err() == nil {
		if d := l.pullDelay(q); d != 0 {
			if d < 0 {
				return
			}
			l.sleep(ctx, q, d)
			continue
		}
		if !l.acquirePull(ctx) {
			return
		}
		l.mu.Lock()
		if q.dropped {
			l.mu.Unlock()
			l.releasePull()
			return
		}
		select { // a restart asked for before this pull concerns an older one
		case <-q.restart:
		default:
		}
		offset, gen, sub := q.pullOffset, q.gen, q.sub
		suspend := l.parked[q.mq] == 0
		if suspend {
			l.parked[q.mq]++
		}
		q.lastPull = time.Now()
		l.mu.Unlock()

		out := make(chan time.Duration, 1)
		l.startPull(ctx, q, gen, sub, offset, suspend, out)
		var d time.Duration
		select {
		case d = <-out:
		case <-q.restart: // seeked: the answer will be stale; pull at the new offset now
		case <-ctx.Done(): // dropped or shutting down
		}
		l.releasePull()
		if d > 0 {
			l.sleep(ctx, q, d)
		}
	}
}

// acquirePull takes a pull slot when WithPullGoroutines bounds the pulls in flight; by
// default each owned queue has its own pull and nothing is shared. It reports false when ctx
// ended first.
func (l *LitePull) acquirePull(ctx context.Context) bool {
	if l.pullSem == nil {
		return true
	}
	select {
	case l.pullSem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// releasePull gives back the slot acquirePull took.
func (l *LitePull) releasePull() {
	if l.pullSem != nil {
		<-l.pullSem
	}
}

// sleep waits for d, for q's wake signal (Poll made room, Resume, Seek), or for ctx.
func (l *LitePull) sleep(ctx context.Context, q *queue, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-q.wake:
	}
}

// pullDelay applies flow control before a pull, in RocketMQ's order: messages cached for all
// queues, messages cached for this queue, bytes cached for this queue, span of this queue.
// It returns 0 to pull now, a delay to wait first, or -1 when q has been dropped.
func (l *LitePull) pullDelay(q *queue) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case q.dropped:
		return -1
	case l.paused[q.mq]:
		return l.cfg.flowControlDelay
	case l.lockedMode() && !(q.locked && time.Now().Before(q.lockValidUntil)):
		return l.cfg.flowControlDelay // lock not renewed in time: wait for the renewal
	case l.cachedBatches*l.cfg.pullBatchSize > l.cfg.thresholdAll:
		return l.cfg.flowControlDelay
	case q.count > l.cfg.thresholdQueue:
		return l.cfg.flowControlDelay
	case q.bytes > l.cfg.thresholdSize:
		return l.cfg.flowControlDelay
	}
	if first, last, ok := q.span(); ok && last-first > l.cfg.maxSpan {
		return l.cfg.flowControlDelay
	}
	return 0
}

// startPull sends one PULL_MESSAGE for q at offset, which the broker may park up to the
// suspend time when suspend is set. Its answer is decoded and applied (applyPull) by the
// pull's callback, and the delay applyPull asks for is then sent on out (buffered: the send
// never blocks), whether or not the task still waits for it. Only finding the broker's
// address waits, bounded by ctx and the pull's timeout.
//
// # Notes
//
// The callback runs on the connection's read goroutine (or, on a timeout, the runtime's
// timer goroutine): it takes l.mu, which is never held across a network call, and does no
// I/O. The answer is not abandoned at the broker when the task stops waiting (see pullTask):
// the call ends with its answer, its timeout, or Close (l.ctx).
func (l *LitePull) startPull(ctx context.Context, q *queue, gen uint64, sub *subscription, offset int64, suspend bool, out chan<- time.Duration) {
	l.wg.Add(1)
	var from int64 // the member of the broker the pull goes to (0: the master)
	finish := func(resp *protocol.Command, err error) {
		defer l.wg.Done()
		var res *pullResult
		if err == nil {
			res, err = l.pullAnswer(resp, q.mq, sub, offset)
		}
		if err != nil {
			err = fmt.Errorf("pull %s at %d: %w", q.mq, offset, err)
		}
		if suspend {
			l.mu.Lock()
			if l.parked[q.mq]--; l.parked[q.mq] <= 0 {
				delete(l.parked, q.mq)
			}
			l.mu.Unlock()
		}
		out <- l.applyPull(q, gen, suspend, from, resp, res, err)
	}
	timeout := l.cfg.suspendedTimeout
	if !suspend {
		timeout = l.cl.RequestTimeout()
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	addr, id, err := l.pullMember(actx, q)
	from = id
	cancel()
	if err != nil {
		from = noMember // no member was asked: nothing to say about any
		finish(nil, err)
		return
	}
	// l.ctx, not ctx: a dropped queue's parked pull still waits for its answer (see pullTask).
	if err := l.cl.InvokeAsync(l.ctx, addr, l.pullRequest(q.mq, sub, offset, suspend), timeout, finish); err != nil {
		finish(nil, err)
	}
}

// pullRequest is the PULL_MESSAGE for mq at offset.
func (l *LitePull) pullRequest(mq MessageQueue, sub *subscription, offset int64, suspend bool) *protocol.Command {
	h := protocol.PullMessageRequestHeader{
		ConsumerGroup:  l.group,
		Topic:          mq.Topic,
		QueueID:        int32(mq.QueueID),
		QueueOffset:    offset,
		MaxMsgNums:     int32(l.cfg.pullBatchSize),
		SysFlag:        protocol.PullFlagSubscription,
		Subscription:   "*",
		ExpressionType: protocol.ExpressionTag,
		BrokerName:     mq.BrokerName,
	}
	if suspend {
		h.SysFlag |= protocol.PullFlagSuspend
		h.SuspendTimeoutMillis = l.cfg.brokerSuspend.Milliseconds()
	}
	if sub != nil {
		h.Subscription, h.ExpressionType, h.SubVersion = sub.expression(), sub.selector.Type(), sub.version
	}
	return protocol.NewRequestWith(protocol.PullMessage, &h, nil)
}

// pullAnswer decodes, re-filters and converts a pull's answer.
func (l *LitePull) pullAnswer(resp *protocol.Command, mq MessageQueue, sub *subscription, offset int64) (*pullResult, error) {
	code := resp.ResponseCode()
	switch code {
	case protocol.Success, protocol.PullNotFound, protocol.PullRetryImmediately, protocol.PullOffsetMoved:
	default:
		return nil, clientcore.NewBrokerError(resp)
	}
	var rh protocol.PullMessageResponseHeader
	if err := resp.DecodeHeader(&rh); err != nil {
		return nil, err
	}
	res := &pullResult{code: code, requested: offset, next: rh.NextBeginOffset, suggest: rh.SuggestWhichBrokerID}
	if code != protocol.Success || len(resp.Body) == 0 {
		return res, nil
	}
	msgs, bytes, err := decodePull(resp.Body, mq, sub, offset, l.cfg.verifyCRC, l.cfg.maxBodySize)
	if err != nil {
		return nil, err
	}
	res.msgs, res.bytes = msgs, bytes
	return res, nil
}

// decodePull decodes the stored messages of a pull's body into Messages, leaving out those
// before offset and those sub's tags do not match; bytes is the sum of their bodies. With
// verify, a body that does not match its stored CRC fails the whole pull.
func decodePull(body []byte, mq MessageQueue, sub *subscription, offset int64, verify bool, maxBody int) (msgs []*Message, bytes int64, err error) {
	// The messages of a pull are handed out together, so they share allocations: one
	// slab of Messages and their properties, and one string for all their property blocks and offset message ids
	// (formerly a string of each per message, the largest part of the consumer's garbage).
	n := countStored(body)
	slab := make([]pulledMessage, n)
	msgs = make([]*Message, 0, n)
	spans := make([]textSpan, 0, n)
	// The property blocks and offset message ids, one after another: on the stack for a
	// pull of 32 small messages, copied once into the string the messages share.
	var stack [8 << 10]byte
	text := stack[:0]
	var cv converter
	var ext protocol.MessageExt // decoded into, message after message: convert copies it out
	opts := protocol.DecodeOptions{VerifyCRC: verify, RawProperties: true, Topic: mq.Topic}
	filter := sub != nil && sub.tags != nil
	for b, i := body, 0; len(b) > 0; i++ {
		size, err := protocol.DecodeStoredTo(&ext, b, opts)
		if err != nil {
			return nil, 0, fmt.Errorf("message %d: %w", i, err)
		}
		b = b[size:]
		if ext.QueueOffset < offset {
			continue
		}
		if filter && !sub.matchBytes(readWellKnown(ext.RawProperties).tags) {
			continue
		}
		var m *Message
		var props *lazyProperties
		if i < len(slab) {
			m, props = &slab[i].m, &slab[i].props
		} else {
			m, props = new(Message), new(lazyProperties) // a message countStored did not count
		}
		if err := cv.convert(m, mq, &ext, props, maxBody); err != nil {
			return nil, 0, err
		}
		sp := textSpan{props: len(text)}
		text = append(text, ext.RawProperties...)
		sp.id = len(text)
		text = protocol.AppendOffsetMsgID(text, ext.StoreHost, ext.CommitLogOffset)
		sp.end = len(text)
		spans = append(spans, sp)
		msgs = append(msgs, m)
		bytes += int64(len(m.Body))
	}
	all := string(text)
	for i, m := range msgs {
		sp := spans[i]
		m.props.raw = all[sp.props:sp.id]
		setWellKnown(m, all[sp.id:sp.end])
	}
	return msgs, bytes, nil
}

// pulledMessage is a Message and its properties, allocated together with the others of
// its pull.
type pulledMessage struct {
	m     Message
	props lazyProperties
}

// textSpan locates one message's property block (props to id) and offset message id (id to
// end) in the string decodePull makes for a pull.
type textSpan struct{ props, id, end int }

// countStored counts the stored messages of a pull body from their TOTALSIZE fields, without
// decoding them. A damaged body may count wrong: decoding it then fails anyway.
func countStored(b []byte) int {
	n := 0
	for len(b) >= 4 {
		size := int(int32(binary.BigEndian.Uint32(b)))
		if size < 4 || size > len(b) {
			break
		}
		b = b[size:]
		n++
	}
	return n
}

// applyPull caches a pull's messages and moves the pull offset, unless q was dropped or
// seeked meanwhile, and notes which member of the broker (from) answered it (resp, nil if
// none did) and where the next pull goes. It returns how long the task should wait before
// its next pull.
func (l *LitePull) applyPull(q *queue, gen uint64, suspended bool, from int64, resp *protocol.Command, res *pullResult, err error) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notePullLocked(q, from, resp, res, err)
	if q.dropped || q.gen != gen || l.closing {
		return 0
	}
	if err != nil {
		if clientcore.IsCode(err, protocol.FlowControl) {
			return l.cfg.brokerFlowDelay
		}
		if ferr := refusal(err); ferr != nil {
			// Retrying will not help until someone fixes the cause: tell the user through
			// Poll, and keep retrying so that a fix is picked up. Logged once per episode.
			l.failures[q.mq] = ferr
			l.wakePollersLocked()
			if q.refused {
				l.log.Debug("pull refused again", "queue", q.mq.String(), "err", err)
				return l.cfg.pullErrorDelay
			}
			q.refused = true
		}
		if !errors.Is(err, context.Canceled) {
			l.log.Warn("pull failed", "queue", q.mq.String(), "err", err)
		}
		return l.cfg.pullErrorDelay
	}
	q.refused = false
	delete(l.failures, q.mq)
	if res.code == protocol.PullOffsetMoved {
		l.log.Warn("pull offset moved", "queue", q.mq.String(), "from", q.pullOffset, "to", res.next)
	}
	q.pullOffset = res.next
	var d time.Duration
	if !suspended && res.code == protocol.PullNotFound {
		d = l.cfg.flowControlDelay // not parked: pace the polling (see pullTask)
	}
	if len(res.msgs) == 0 {
		// Nothing to hand out (caught up, everything filtered out, or an offset correction):
		// the consume offset follows once the messages cached before are handed out. Offsets
		// that follow each other without messages in between fold into one offset-only batch,
		// so that a long run of filtered-out messages cannot grow the cache while nobody
		// polls (flow control counts messages, not these).
		switch last := len(q.cache) - 1; {
		case last < 0:
			q.consumeOffset = res.next
		case len(q.cache[last].msgs) == 0:
			q.cache[last].next = res.next
		case q.cache[last].next != res.next:
			q.cache = append(q.cache, &batch{next: res.next})
		}
		return d
	}
	q.cache = append(q.cache, &batch{msgs: res.msgs, next: res.next, bytes: res.bytes})
	q.count += len(res.msgs)
	q.bytes += res.bytes
	l.cachedBatches++
	l.wakePollersLocked()
	return 0
}

// refusal returns err wrapped with the sentinel of a pull answer that retrying will not
// change (the subscription cannot be compiled, the topic or the group does not exist), or
// nil for any other failure, which is retried in silence.
func refusal(err error) error {
	var be *clientcore.BrokerError
	if !errors.As(err, &be) {
		return nil
	}
	switch be.Code {
	case protocol.SubscriptionParseFailed:
		return fmt.Errorf("%w: %w", ErrSubscriptionRefused, err)
	case protocol.TopicNotExist:
		return fmt.Errorf("%w: %w", ErrTopicNotExist, err)
	case protocol.SubscriptionGroupNotExist:
		return fmt.Errorf("%w: %w", ErrGroupNotExist, err)
	}
	return nil
}
