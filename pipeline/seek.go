package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/consumer"
)

// Seek positions for SeekRequest.Position.
const (
	SeekFirst     = "first"
	SeekLast      = "last"
	SeekTimestamp = "timestamp"
	SeekOffset    = "offset"
)

// SeekRequest moves a pipeline's position in one queue or in every queue it owns.
type SeekRequest struct {
	// Queue is the queue to move; nil moves every queue the pipeline owns now.
	Queue *consumer.MessageQueue `json:"queue,omitempty" yaml:"queue,omitempty"`
	// Position is first, last, timestamp or offset.
	Position string `json:"position" yaml:"position"`
	// Timestamp is the store time to move to, with Position timestamp.
	Timestamp time.Time `json:"timestamp,omitzero" yaml:"timestamp,omitempty"`
	// Offset is the queue offset to move to, with Position offset (Queue required).
	Offset int64 `json:"offset,omitempty" yaml:"offset,omitempty"`
}

// validate names the field of a malformed request in a *FieldError.
func (r SeekRequest) validate() error {
	switch r.Position {
	case SeekFirst, SeekLast:
	case SeekTimestamp:
		if r.Timestamp.IsZero() {
			return badRequestField("timestamp", "required with position timestamp")
		}
	case SeekOffset:
		if r.Queue == nil {
			return badRequestField("queue", "required with position offset")
		}
		if r.Offset < 0 {
			return badRequestField("offset", "%d is negative", r.Offset)
		}
	default:
		return badRequestField("position", "%q is not first, last, timestamp or offset", r.Position)
	}
	return nil
}

// seek moves queues. Batches polled before are dropped; the new position is committed
// (for offset and timestamp at once, for first and last with the first batch processed
// from there).
func (p *Pipeline) seek(ctx context.Context, r SeekRequest) error {
	if err := r.validate(); err != nil {
		return err
	}
	queues := p.c.Assignment()
	if r.Queue != nil {
		queues = []consumer.MessageQueue{*r.Queue}
	}
	// Stop polling, and wait for a poll in progress to tag its batch: every batch tagged
	// from now on is read after the seek.
	p.mu.Lock()
	p.seeking++
	if p.pollCancel != nil {
		p.pollCancel()
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.seeking--
		p.notifyLocked()
		p.mu.Unlock()
	}()
	if err := p.waitFor(ctx, func() bool { return !p.polling }); err != nil {
		return fmt.Errorf("pipeline %s: seek: %w", p.def.Name, err)
	}
	for _, mq := range queues {
		if err := p.seekQueue(ctx, mq, r); err != nil {
			return fmt.Errorf("pipeline %s: %w", p.def.Name, err)
		}
	}
	return nil
}

// seekQueue moves mq as r says, under mq's commitMu only: a seek of one queue waits for no
// other queue's commit.
func (p *Pipeline) seekQueue(ctx context.Context, mq consumer.MessageQueue, r SeekRequest) error {
	qs := p.queue(mq)
	qs.commitMu.Lock()
	defer qs.commitMu.Unlock()
	p.mu.Lock()
	qs.seekGen++
	p.mu.Unlock()
	var err error
	off := int64(-1)
	switch r.Position {
	case SeekFirst:
		err = p.c.SeekToBegin(ctx, mq)
	case SeekLast:
		err = p.c.SeekToEnd(ctx, mq)
	case SeekTimestamp:
		if off, err = p.c.OffsetForTimestamp(ctx, mq, r.Timestamp); err == nil {
			err = p.c.Seek(ctx, mq, off)
		}
	case SeekOffset:
		off = r.Offset
		err = p.c.Seek(ctx, mq, off)
	}
	if err != nil {
		return err
	}
	if off >= 0 {
		if err := p.c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{mq: off}); err != nil {
			return fmt.Errorf("commit seek of %s: %w", mq, err)
		}
		p.mu.Lock()
		qs.committed = off
		p.mu.Unlock()
	}
	return nil
}
