package consumer

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// Seek moves the consume position of an assigned queue to offset, which must lie within the
// queue's [min offset, max offset]. Cached messages of the queue are dropped and the next Poll
// of it starts at offset. With auto-commit the new position is committed at the next commit.
// A seek is the one way to commit an offset below one already committed (see CommitOffsets).
func (l *LitePull) Seek(ctx context.Context, mq MessageQueue, offset int64) error {
	return l.seek(ctx, mq, "seek "+mq.String()+" to "+strconv.FormatInt(offset, 10), func() (int64, error) {
		minOff, err := l.queryOffset(ctx, protocol.GetMinOffset, mq)
		if err != nil {
			return 0, err
		}
		maxOff, err := l.queryOffset(ctx, protocol.GetMaxOffset, mq)
		if err != nil {
			return 0, err
		}
		if offset < minOff || offset > maxOff {
			return 0, fmt.Errorf("%w [%d, %d]", ErrOffsetOutOfRange, minOff, maxOff)
		}
		return offset, nil
	})
}

// SeekToBegin seeks an assigned queue to its min offset.
func (l *LitePull) SeekToBegin(ctx context.Context, mq MessageQueue) error {
	return l.seek(ctx, mq, "seek "+mq.String()+" to begin", func() (int64, error) {
		return l.queryOffset(ctx, protocol.GetMinOffset, mq)
	})
}

// SeekToEnd seeks an assigned queue to its max offset: only messages stored from now on.
func (l *LitePull) SeekToEnd(ctx context.Context, mq MessageQueue) error {
	return l.seek(ctx, mq, "seek "+mq.String()+" to end", func() (int64, error) {
		return l.queryOffset(ctx, protocol.GetMaxOffset, mq)
	})
}

// seek runs the checks every seek shares, then moves mq to the offset target computes; what
// names the call in errors.
func (l *LitePull) seek(ctx context.Context, mq MessageQueue, what string, target func() (int64, error)) error {
	if err := l.checkRunning(); err != nil {
		return err
	}
	if err := l.assignedCheck(mq); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	off, err := target()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := l.seekTo(mq, off); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

func (l *LitePull) assignedCheck(mq MessageQueue) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.queues[mq]; !ok {
		return ErrNotAssigned
	}
	return nil
}

// seekTo moves mq's positions to offset.
func (l *LitePull) seekTo(mq MessageQueue, offset int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	q, ok := l.queues[mq]
	if !ok {
		return ErrNotAssigned
	}
	q.floor = -1 // an explicit move: the next commit may go back
	if !q.active {
		q.seekOffset = offset
		return nil
	}
	l.clearCacheLocked(q)
	q.pullOffset, q.consumeOffset = offset, offset
	q.gen++
	select { // a pull parked at the old offset would hold the task for the suspend time
	case q.restart <- struct{}{}:
	default:
	}
	q.signal()
	return nil
}

// OffsetForTimestamp returns the offset of the first message of mq stored at or after ts.
func (l *LitePull) OffsetForTimestamp(ctx context.Context, mq MessageQueue, ts time.Time) (int64, error) {
	if err := l.checkRunning(); err != nil {
		return 0, err
	}
	return l.searchOffset(ctx, mq, ts)
}

func (l *LitePull) searchOffset(ctx context.Context, mq MessageQueue, ts time.Time) (int64, error) {
	h := protocol.SearchOffsetRequestHeader{Topic: mq.Topic, QueueID: int32(mq.QueueID), Timestamp: ts.UnixMilli(), BrokerName: mq.BrokerName}
	off, err := l.askOffset(ctx, mq, protocol.NewRequestWith(protocol.SearchOffsetByTimestamp, &h, nil))
	if err != nil {
		return 0, fmt.Errorf("offset of %s at %s: %w", mq, ts.Format(time.RFC3339Nano), err)
	}
	return off, nil
}

// queryOffset asks GET_MIN_OFFSET or GET_MAX_OFFSET of mq.
func (l *LitePull) queryOffset(ctx context.Context, code protocol.RequestCode, mq MessageQueue) (int64, error) {
	var req *protocol.Command
	if code == protocol.GetMinOffset {
		req = protocol.NewRequestWith(code, &protocol.GetMinOffsetRequestHeader{Topic: mq.Topic, QueueID: int32(mq.QueueID), BrokerName: mq.BrokerName}, nil)
	} else {
		req = protocol.NewRequestWith(code, &protocol.GetMaxOffsetRequestHeader{Topic: mq.Topic, QueueID: int32(mq.QueueID), BrokerName: mq.BrokerName}, nil)
	}
	off, err := l.askOffset(ctx, mq, req)
	if err != nil {
		return 0, fmt.Errorf("%s of %s: %w", code, mq, err)
	}
	return off, nil
}

// askOffset sends req, which is answered with an offset header, to mq's broker.
func (l *LitePull) askOffset(ctx context.Context, mq MessageQueue, req *protocol.Command) (int64, error) {
	addr, err := l.cl.FindBrokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return 0, err
	}
	resp, err := l.cl.InvokeOK(ctx, addr, req)
	if err != nil {
		return 0, err
	}
	var out protocol.OffsetResponseHeader
	if err := resp.DecodeHeader(&out); err != nil {
		return 0, fmt.Errorf("answer from %s: %w", addr, err)
	}
	return out.Offset, nil
}
