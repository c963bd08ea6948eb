package broker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/broker/filter"
	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/remoting"
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
	if resp := b.ensureGroup(req, h.ConsumerGroup); resp != nil {
		return resp
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

	if h.SysFlag&protocol.PullFlagCommitOffset != 0 && h.CommitOffset >= 0 {
		b.commitPulled(c, h.ConsumerGroup, h.Topic, h.QueueID, h.CommitOffset)
	}

	// The store sizes its consume-queue scan buffer from maxMsgs (20 bytes a message), so an
	// uncapped maxMsgNums of 2^31-1 made one pull allocate 40 GiB and kill the broker. A batch
	// never holds more than 32 messages anyway (the store's residency cap).
	maxMsgs := min(max(int(h.MaxMsgNums), 1), maxPullMsgs)
	maxBytes := int(h.MaxMsgBytes)

	owner := pollOwner{c, h.ConsumerGroup}
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
	// table. Only a pull that finds nothing parks, and then reads once more, so that a message
	// dispatched between its first read and its parking still wakes it.
	//
	// A parked pull is woken by any arrival whose tag code its filter admits (the dispatcher
	// checks nothing else: see longPoll) and decides on the arrivals itself, with the full
	// filter, in one read: when they all fail the filter it moves past them and parks again,
	// so the client is answered only for a message that matches (or at its timeout, with
	// nextBeginOffset past what was rejected).
	// Answer from the commit-log files unless the filter reads the messages' content.
	zeroCopy := !b.cfg.DisableZeroCopy && (f == nil || f.Match == nil)
	from := h.QueueOffset // where this pull reads: moves only past rejected messages
	// Once parked, the pull stays registered until it answers: a wake-up that comes while it
	// reads waits in w.ready, and a newer pull of the same client finds it to supersede.
	var w *pollWaiter
	var deadline *time.Timer // set when this pull parks
	defer func() {
		if w != nil {
			b.poll.unpark(w)
		}
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		var res *store.GetResult
		var err error
		if zeroCopy {
			res, err = b.store.GetRegions(ctx, h.Topic, h.QueueID, from, maxMsgs, maxBytes, f)
		} else {
			res, err = b.store.GetMessage(ctx, h.Topic, h.QueueID, from, maxMsgs, maxBytes, f)
		}
		if err != nil {
			if errors.Is(err, store.ErrFilterFailed) {
				// Fail-closed filter: the consumer retries from its offset after its error
				// back-off; no other queue waits for this one.
				b.log.Warn("pull: message filter failed", "group", h.ConsumerGroup, "topic", h.Topic, "queue", h.QueueID, "err", err)
				return errorResponse(req, protocol.SystemError, err)
			}
			return storeErrorResponse(req, err)
		}
		code := pullCode(res.Status, h.QueueOffset)
		// OFFSET_FOUND_NULL is not "caught up": the consume-queue file at the offset is gone
		// and NextBeginOffset says where the next one starts, so answer at once (RocketMQ
		// would park it for the whole suspend time before telling the consumer).
		if res.Status == store.OffsetFoundNull {
			suspend = false
		}
		if w != nil && w.superseded.Load() {
			suspend = false // the client moved on: answer now with what is there
		}
		if res.Status == store.NoMatchedMessage && suspend && w != nil {
			// Parked, and what arrived does not match: skip it and keep waiting.
			from = res.NextBeginOffset
			res.Release()
			b.poll.advance(w, from)
			continue
		}
		if code == protocol.PullNotFound && suspend && w == nil && !remoting.Park(ctx) {
			suspend = false // the connection has all the parked pulls it may have: answer now
		}
		if code != protocol.PullNotFound || !suspend {
			if w == nil {
				b.poll.supersede(h.Topic, h.QueueID, owner) // this pull replaces any the owner parked
			}
			n, size := res.Count, res.TotalBytes
			// pullResponse releases res or hands it to the transport, whatever follows.
			resp := b.pullResponse(ctx, req, code, res)
			if o := b.cfg.Observer; o != nil {
				if n > 0 {
					o.MessagesOut(h.Topic, n, size)
				}
				o.PullLatency(time.Since(began), w != nil)
			}
			return resp
		}
		res.Release()
		if w == nil {
			// The header is decoded, and the answer needs only req's opaque, code and flags:
			// a parked pull must not hold the request's header map (about 1.5 KiB) for its
			// whole suspend time.
			req.ExtFields = nil
			w = b.poll.park(h.Topic, h.QueueID, from, f, owner)
			deadline = time.NewTimer(wait)
			continue // the read after parking
		}
		b.poll.waiting.Add(1)
		select {
		case <-w.ready:
		case <-deadline.C:
			suspend = false // out of time: answer with whatever is there now
		case <-ctx.Done():
			suspend = false
		case <-b.ctx.Done():
			suspend = false
		}
		b.poll.waiting.Add(-1)
	}
}

// pullResponse answers a pull with what res holds. Regions go to the transport, which sends
// them from the files and releases res once they are written; everything else is copied
// into the body and res released here.
func (b *Broker) pullResponse(ctx context.Context, req *protocol.Command, code protocol.ResponseCode, res *store.GetResult) *protocol.Command {
	resp := protocol.NewResponse(req, code, res.Status.String())
	(&protocol.PullMessageResponseHeader{
		NextBeginOffset: res.NextBeginOffset,
		MinOffset:       res.MinOffset,
		MaxOffset:       res.MaxOffset,
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
