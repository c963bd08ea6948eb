package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// Start connects, registers the consumer in its group and starts pulling. A consumer starts
// once: Start on a consumer in any state but CreateJust fails with ErrBadState. If Start fails
// the consumer is left in StartFailed, with nothing of it left running: it has left its group
// again and closed its client core (a shared one is only left, not closed).
//
// ctx bounds Start: when it ends before Start is done (or has already ended), Start fails
// with ctx's error. Start does not fail because a subscribed topic does not exist yet: its
// route is fetched again on every rebalance and metadata check.
func (l *LitePull) Start(ctx context.Context) (err error) {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	if s := l.State(); s != CreateJust {
		return fmt.Errorf("start consumer %q: %w: %s", l.group, ErrBadState, s)
	}
	l.state.Store(int32(StartFailed))
	registered := false
	defer func() {
		if err == nil {
			return
		}
		l.cancel()
		// ctx may be what failed Start: undo with its values but not its end (the client
		// bounds each request by its own timeout).
		undo := context.WithoutCancel(ctx)
		if registered && !l.ownsClient {
			if uerr := l.cl.UnregisterConsumer(undo, l.group); uerr != nil {
				l.log.Warn("leaving the group after a failed start", "err", uerr)
			}
		}
		if l.ownsClient {
			_ = l.cl.Close(undo) // unregisters and waits for the client's goroutines
		}
		err = fmt.Errorf("start consumer %q: %w", l.group, err)
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.cl.Start(); err != nil { // a shared client may already run: Start is idempotent
		return err
	}
	// Set before registering: the client may call the hooks from then on.
	l.started = time.Now()
	if l.cfg.consumeFrom == ConsumeFromTimestamp && l.cfg.consumeTS.IsZero() {
		l.cfg.consumeTS = l.started.Add(-DefaultConsumeTimestampAgo)
	}
	// A reader joins no group: no heartbeat may name it (see NewReader).
	if !l.cfg.reader {
		if err := l.cl.RegisterConsumer(l.group, (*hooks)(l)); err != nil {
			return err
		}
		registered = true
	}
	for _, topic := range l.topics() {
		if r, err := l.cl.Route(ctx, topic); err != nil {
			if ctx.Err() != nil {
				return err
			}
			lvl := slog.LevelWarn
			if isRetryTopic(topic) {
				lvl = slog.LevelDebug
			}
			l.log.Log(ctx, lvl, "no route for topic yet", "topic", topic, "err", err)
		} else {
			l.setTopicQueues(topic, r.SubscribeQueues, false)
		}
	}
	if registered {
		if err := l.cl.SendHeartbeat(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			l.log.Warn("first heartbeat failed", "err", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l.state.Store(int32(Running))
	l.wg.Add(2)
	go l.rebalanceLoop()
	go l.metadataLoop()
	if l.cfg.autoCommit {
		l.wg.Add(1)
		go l.every(l.cfg.autoCommitInt, l.autoCommit)
	}
	l.triggerRebalance()
	l.log.Info("consumer started", "model", l.cfg.model, "handoverLocks", l.cfg.handoverLocks)
	return nil
}

// topics returns every topic the consumer reads or listens to.
func (l *LitePull) topics() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	set := map[string]bool{}
	for t := range l.subs {
		set[t] = true
	}
	for mq := range l.assigned {
		set[mq.Topic] = true
	}
	for t := range l.topicListeners {
		set[t] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// Close stops the consumer: Poll stops handing out messages, pulling stops, the offsets of
// every owned queue are committed, their locks released, and the consumer leaves its group on
// every broker, which tells the other members to rebalance at once. It waits for every
// goroutine of the consumer, bounded by ctx for the network calls. Closing a consumer that is
// not running does nothing. The revoke function (WithOnQueuesRevoked) is told of the queues
// before they are committed.
func (l *LitePull) Close(ctx context.Context) error {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	switch l.State() {
	case CreateJust:
		l.state.Store(int32(ShutdownAlready))
		l.cancel()
		if l.ownsClient {
			return l.cl.Close(ctx)
		}
		return nil
	case Running:
	default:
		return nil
	}
	l.mu.Lock()
	l.closing = true
	close(l.dataCh) // wakes every Poll; they see closing
	l.dataCh = make(chan struct{})
	l.mu.Unlock()
	l.state.Store(int32(ShutdownAlready))
	l.cancel()
	l.wg.Wait()

	l.retryHandovers(ctx)
	l.mu.Lock()
	all := slices.Collect(maps.Values(l.queues))
	for _, q := range all {
		l.detachLocked(q)
	}
	l.order = nil
	l.mu.Unlock()
	l.revoke(ctx, all)
	err := l.release(ctx, all)
	if !l.cfg.reader {
		if uerr := l.cl.UnregisterConsumer(ctx, l.group); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	if l.ownsClient {
		err = errors.Join(err, l.cl.Close(ctx))
	}
	l.log.Info("consumer closed")
	if err != nil {
		return fmt.Errorf("close consumer %q: %w", l.group, err)
	}
	return nil
}

// every runs fn every d until Close, on a goroutine counted in wg.
func (l *LitePull) every(d time.Duration, fn func()) {
	defer l.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}
