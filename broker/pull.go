package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// maxPullMsgs caps a pull's maxMsgNums: well above any batch the store returns (32), low
// enough that its scan buffer (maxMsgs × 20 bytes) stays small.
const maxPullMsgs = 1024

// pullCode maps a read status to the pull response code, as a RocketMQ broker does.
func pullCode(st store.GetStatus, requested int64) protocol.ResponseCode {
	switch st {
	case store.Found:
		return protocol.Success
	case store.NoMatchedMessage, store.MessageWasRemoving:
		return protocol.PullRetryImmediately
	case store.NoMatchedLogicQueue, store.NoMessageInQueue:
		if requested != 0 {
			return protocol.PullOffsetMoved
		}
		return protocol.PullNotFound
	case store.OffsetFoundNull, store.OffsetOverflowOne:
		return protocol.PullNotFound
	case store.OffsetOverflowBadly, store.OffsetTooSmall:
		return protocol.PullOffsetMoved
	}
	return protocol.SystemError
}

// processPull serves PULL_MESSAGE, parking it when it finds nothing and asks to be suspended.
func (b *Broker) processPull(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	var h protocol.PullMessageRequestHeader
	if err := req.DecodeHeader(&h); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist", h.Topic))
	}
	if !tc.Readable() {
		return errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is not readable (perm %d)", h.Topic, tc.Perm))
	}
	if h.QueueID < 0 || int(h.QueueID) >= tc.ReadQueueNums {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: topic %q has %d read queues", h.QueueID, h.Topic, tc.ReadQueueNums))
	}
	// A stateless read (protocol.ReaderGroup) creates no group, and so no retry topic.
	reader := h.ConsumerGroup == protocol.ReaderGroup
	if !reader {
		if resp := b.ensureGroup(req, h.ConsumerGroup); resp != nil {
			return resp
		}
	}

	// The filter is compiled once per subscription version and shared by every pull of it.
	var f *store.Filter
	var err error
	if h.SysFlag&protocol.PullFlagSubscription != 0 {
		f, err = b.cfg.Filters.Filter(ctx, filter.Subscription{Group: h.ConsumerGroup, Topic: h.Topic,
			ExpressionType: h.ExpressionType, Expression: h.Subscription, Version: h.SubVersion})
	} else if sub, ok := b.consumers.subscription(h.ConsumerGroup, h.Topic); ok {
		f, err = b.cfg.Filters.Filter(ctx, filter.Subscription{Group: h.ConsumerGroup, Topic: h.Topic,
			ExpressionType: sub.ExpressionType, Expression: sub.Expression, Version: sub.Version})
	}
	if err != nil {
		return errorResponse(req, protocol.SubscriptionParseFailed, err)
	}

	var began time.Time
	if b.cfg.Observer != nil {
		began = time.Now()
	}

	if h.SysFlag&protocol.PullFlagCommitOffset != 0 && h.CommitOffset >= 0 && !reader {
		b.commitPulled(c, h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset)
	}

	// The store sizes its consume-queue scan buffer from maxMsgs (20 bytes a message), so an
	// uncapped maxMsgNums of 2^31-1 made one pull allocate 40 GiB and kill the broker. A batch
	// never holds more than 32 messages anyway (the store's residency cap).
	maxMsgs := min(max(int(h.MaxMsgNums), 1), maxPullMsgs)
	maxBytes := int(h.MaxMsgBytes)

	suspend := h.SysFlag&protocol.PullFlagSuspend != 0 && h.SuspendTimeoutMillis > 0
	var wait time.Duration
	if suspend {
		// Compare in milliseconds: a hostile suspendTimeoutMillis would overflow a Duration.
		wait = b.cfg.MaxLongPoll
		if h.SuspendTimeoutMillis < wait.Milliseconds() {
			wait = time.Duration(h.SuspendTimeoutMillis) * time.Millisecond
		}
	}

	// Read first: a consumer that is behind finds messages without touching the long-poll
	// table. Only a pull that finds nothing parks (see serveParked for what follows).
	// Answer from the commit-log files unless the filter reads the messages' content.
	zeroCopy := !b.cfg.DisableZeroCopy && (f == nil || f.Match == nil)
	res, err := b.readPull(ctx, h.Topic, h.QueueID, h.QueueOffset, maxMsgs, maxBytes, f, zeroCopy)
	if err != nil {
		return b.pullReadError(req, h.ConsumerGroup, h.Topic, h.QueueID, h.QueueOffset, err)
	}
	code := pullCode(res.Status, h.QueueOffset)
	if rc, ok := b.replicaCaughtUp(res, code, h.QueueOffset); ok {
		return b.answerPull(ctx, req, h.Topic, h.QueueID, pollOwner{c, h.ConsumerGroup}, rc, res, began)
	}
	// OFFSET_FOUND_NULL is not "caught up": the consume-queue file at the offset is gone and
	// NextBeginOffset says where the next one starts, so answer at once (RocketMQ would park
	// it for the whole suspend time before telling the consumer).
	if code != protocol.PullNotFound || !suspend || res.Status == store.OffsetFoundNull {
		return b.answerPull(ctx, req, h.Topic, h.QueueID, pollOwner{c, h.ConsumerGroup}, code, res, began)
	}

	// Nothing yet: defer the answer (remoting.Defer) and leave a waiter in the long-poll
	// table. The waiter keeps what the pull needs to read again and answer, not the request:
	// the topic's name is the topic table's, the group's a copy, so the request's header
	// (its map, or the header text its strings point into) goes with the request.
	w := &pollWaiter{
		key:       pollKey{tc.Name, h.QueueID},
		owner:     pollOwner{c, strings.Clone(h.ConsumerGroup)},
		offset:    h.QueueOffset,
		filter:    f,
		requested: h.QueueOffset,
		maxMsgs:   int32(maxMsgs),
		maxBytes:  int32(min(maxBytes, math.MaxInt32)),
		zeroCopy:  zeroCopy,
	}
	d, ok := remoting.Defer(ctx, func() { b.poll.unpark(w) })
	if !ok {
		// The connection has all the parked pulls it may have (or this is no transport
		// request): answer now, with what there is.
		return b.answerPull(ctx, req, h.Topic, h.QueueID, pollOwner{c, h.ConsumerGroup}, code, res, began)
	}
	res.Release()
	w.d = d
	if b.cfg.Observer != nil {
		w.began = int64(began.Sub(b.poll.epoch))
	}
	b.poll.park(w, wait)
	// The read after parking, on this goroutine: a message dispatched between the first read
	// and the parking has not woken the waiter. Then the handler returns, and the answer
	// goes through d.
	b.serveParked(w)
	return nil
}

// readPull reads a pull's messages: their regions in the commit-log files, or (zeroCopy
// false: the filter reads content) their bytes.
func (b *Broker) readPull(ctx context.Context, topic string, queueID int32, from int64, maxMsgs, maxBytes int, f *store.Filter, zeroCopy bool) (*store.GetResult, error) {
	if zeroCopy {
		return b.store.GetRegions(ctx, topic, queueID, from, maxMsgs, maxBytes, f)
	}
	return b.store.GetMessage(ctx, topic, queueID, from, maxMsgs, maxBytes, f)
}

// pullReadError answers a pull from offset whose read failed.
func (b *Broker) pullReadError(req *protocol.Command, group, topic string, queueID int32, offset int64, err error) *protocol.Command {
	switch {
	case errors.Is(err, store.ErrFilterFailed):
		// Fail-closed filter: the consumer retries from its offset after its error back-off;
		// no other queue waits for this one.
		b.log.Warn("pull: message filter failed", "group", group, "topic", topic, "queue", queueID, "err", err)
		return errorResponse(req, protocol.SystemError, err)
	case errors.Is(err, store.ErrReadFailed):
		// The disk could not give back the next message. SYSTEM_ERROR is what RocketMQ's
		// clients retry (after their error back-off) from the same offset, which is what
		// must happen: answering anything with a nextBeginOffset would skip the message.
		b.log.Error("pull: store read failed", "group", group, "topic", topic, "queue", queueID, "offset", offset, "err", err)
		return protocol.NewResponse(req, protocol.SystemError, fmt.Sprintf(
			"the broker could not read the message store for %s/%d from offset %d; nothing was skipped, pull again from that offset: %v",
			topic, queueID, offset, err))
	}
	return storeErrorResponse(req, err)
}

// answerPull answers a pull that did not park, with what res holds.
func (b *Broker) answerPull(ctx context.Context, req *protocol.Command, topic string, queueID int32, owner pollOwner, code protocol.ResponseCode, res *store.GetResult, began time.Time) *protocol.Command {
	b.poll.supersede(topic, queueID, owner) // this pull replaces any the owner parked
	n, size := res.Count, res.TotalBytes
	// pullResponse releases res or hands it to the transport, whatever follows.
	var suggest int64
	if code == protocol.Success {
		suggest = b.suggestBroker(res.InDisk)
	}
	resp := b.pullResponse(ctx, req, code, res, remoting.Deferred{}, suggest)
	if o := b.cfg.Observer; o != nil {
		if n > 0 {
			o.MessagesOut(topic, n, size)
		}
		o.PullLatency(time.Since(began), false)
	}
	return resp
}

// serveParked runs a parked pull: it reads the queue from where the pull waits and answers
// through the pull's Deferred, or parks it again (longPoll.rest) when there is nothing to
// answer with yet. It runs on the goroutine of the request that parked (the read after
// parking) and afterwards on a long-poll runner each time the pull is woken: by an arrival,
// its timeout, a newer pull of its owner (superseded), or shutdown. The last three make it
// answer with what there is, as a pull that did not suspend; a dropped pull (its connection
// closed) is forgotten without an answer.
//
// A parked pull is woken by any arrival whose tag code its filter admits (the dispatcher
// checks nothing else: see longPoll) and decides on the arrivals itself, with the full
// filter, in one read: when they all fail the filter it moves past them and parks again,
// so the client is answered only for a message that matches (or at its timeout, with
// nextBeginOffset past what was rejected).
//
// A panic (a filter's, say) is recovered and answered SYSTEM_ERROR, as the transport does for
// a Handler: on a runner there is no Handler call around it to do so.
func (b *Broker) serveParked(w *pollWaiter) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("parked pull panicked", "group", w.owner.group, "topic", w.key.topic, "queue", w.key.queueID,
				"panic", r, "stack", string(debug.Stack()))
			b.poll.unpark(w)
			w.d.Respond(protocol.NewResponse(w.request(), protocol.SystemError, fmt.Sprintf("handler panic: %v", r)))
		}
	}()
	ctx := w.d.Context()
	for {
		if ctx.Err() != nil {
			// The connection closed: nobody to answer (and its close may have dropped the
			// pull before it was parked).
			b.poll.unpark(w)
			w.d.Respond(nil)
			return
		}
		from, final := b.poll.reading(w)
		res, err := b.readPull(ctx, w.key.topic, w.key.queueID, from, int(w.maxMsgs), int(w.maxBytes), w.filter, w.zeroCopy)
		if err != nil {
			b.poll.unpark(w)
			w.d.Respond(b.pullReadError(w.request(), w.owner.group, w.key.topic, w.key.queueID, from, err))
			return
		}
		code := pullCode(res.Status, w.requested)
		suspend := !final && res.Status != store.OffsetFoundNull
		if res.Status == store.NoMatchedMessage && suspend {
			// What arrived does not match: skip it and keep waiting.
			res.Release()
			b.poll.advance(w, res.NextBeginOffset)
			continue
		}
		if code != protocol.PullNotFound || !suspend {
			b.poll.unpark(w)
			n, size := res.Count, res.TotalBytes
			// pullResponse releases res or hands it to the transport, whatever follows.
			if resp := b.pullResponse(ctx, w.request(), code, res, w.d, 0); resp != nil {
				w.d.Respond(resp)
			}
			if o := b.cfg.Observer; o != nil {
				if n > 0 {
					o.MessagesOut(w.key.topic, n, size)
				}
				o.PullLatency(time.Duration(b.poll.now()-w.began), true)
			}
			return
		}
		res.Release()
		if !b.poll.rest(w) {
			return
		}
	}
}

// request is what a parked pull's answer is built from: the transport sets its opaque and
// serialize type from the request it deferred.
func (w *pollWaiter) request() *protocol.Command {
	return &protocol.Command{Code: int32(protocol.PullMessage)}
}

// pullResponse answers a pull with what res holds, suggesting broker id suggest for the
// next pull (suggestBroker; a parked pull was caught up, so 0). Regions go to the transport, which sends
// them from the files and releases res once they are written; everything else is copied
// into the body and res released here.
//
// A parked pull's answer (d not zero) with regions goes through d.RespondFiles, and
// pullResponse then returns nil; any other answer is returned for the caller to send.
func (b *Broker) pullResponse(ctx context.Context, req *protocol.Command, code protocol.ResponseCode, res *store.GetResult, d remoting.Deferred, suggest int64) *protocol.Command {
	resp := protocol.NewResponse(req, code, res.Status.String())
	(&protocol.PullMessageResponseHeader{
		NextBeginOffset:      res.NextBeginOffset,
		MinOffset:            res.MinOffset,
		MaxOffset:            res.MaxOffset,
		SuggestWhichBrokerID: suggest,
	}).EncodeTo(resp.ExtFields)
	if code != protocol.Success || res.TotalBytes == 0 {
		res.Release()
		return resp
	}
	if len(res.Regions) > 0 {
		regions := make([]remoting.FileRegion, len(res.Regions))
		for i, r := range res.Regions {
			regions[i] = remoting.FileRegion{File: r.File, Offset: r.Offset, Length: r.Length}
		}
		if d != (remoting.Deferred{}) {
			d.RespondFiles(resp, regions, res.Release)
			return nil
		}
		if remoting.RespondWithFiles(ctx, resp, regions, res.Release) {
			return resp
		}
		// Not served by the transport (a direct call): copy the regions.
		body := make([]byte, res.TotalBytes)
		at := 0
		for _, r := range res.Regions {
			if _, err := r.File.ReadAt(body[at:at+int(r.Length)], r.Offset); err != nil {
				res.Release()
				return storeErrorResponse(req, err)
			}
			at += int(r.Length)
		}
		res.Release()
		resp.Body = body
		return resp
	}
	defer res.Release()
	body := make([]byte, 0, res.TotalBytes)
	for _, m := range res.Messages {
		body = append(body, m...)
	}
	resp.Body = body
	return resp
}
