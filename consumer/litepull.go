package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/internal/client"
	"github.com/flowd-io/flowd/protocol"
)

// LitePull is RocketMQ's lite-pull consumer: it pulls the queues it owns in the background and
// hands their messages out through Poll.
//
// Queues come either from Subscribe (the group's members share each subscribed topic's queues,
// rebalancing as members come and go) or from Assign (an explicit list, no group sharing); the
// two are mutually exclusive. All methods are safe for concurrent use.
//
// # Lock order
//
//	startMu → commitMu → mu
//	client.Client's heartbeat lock → mu   (the client calls ConsumerData with it held)
//
// startMu serializes Start and Shutdown. commitMu serializes every write of offsets to the
// offset store with queue hand-overs (commit, then unlock), and is held across that network
// I/O. mu guards the consumer's in-memory state and is never held across network I/O, while
// calling into the client core or while calling user code. Queues join and leave the owned
// set only on the rebalance goroutine (and in Shutdown, after that goroutine has ended), so a
// rebalance never races another rebalance.
type LitePull struct {
	group      string
	cfg        config
	log        *slog.Logger
	cl         *client.Client
	ownsClient bool
	store      offsetStore

	state   atomic.Int32
	startMu sync.Mutex
	started time.Time

	ctx         context.Context // cancelled by Shutdown
	cancel      context.CancelFunc
	wg          sync.WaitGroup // loops and pull tasks
	pullSem     chan struct{}
	rebalanceCh chan struct{}

	commitMu sync.Mutex

	mu             sync.Mutex
	closing        bool
	mode           subMode
	subs           map[string]*subscription
	assigned       map[MessageQueue]bool
	paused         map[MessageQueue]bool
	queues         map[MessageQueue]*queue // owned: assigned to us, locked or waiting for the lock
	order          []*queue                // queues, sorted; Poll rotates through it
	cursor         int
	cachedBatches  int
	dataCh         chan struct{} // closed and replaced when a batch is cached
	dataWaited     bool
	needHeartbeat  bool
	renewNow       bool   // a broker connection closed: renew the locks as soon as we heartbeat again
	lockEpoch      uint64 // bumped by ConnectionLost: lock answers sent before are not trusted
	topicQueues    map[string][]MessageQueue
	topicListeners map[string][]func(topic string, queues []MessageQueue)
	previous       map[string]map[string][]MessageQueue // topic → client id → queues, last rebalance
	handover       map[MessageQueue]handover            // dropped queues whose commit failed: commit, then unlock
	parked         map[MessageQueue]int                 // long-polling pulls in flight, by queue (see pullTask)
}

type subMode int

const (
	modeNone subMode = iota
	modeSubscribe
	modeAssign
)

// queue is the consumer's state for one owned queue (RocketMQ's ProcessQueue plus the
// assigned-queue offsets).
type queue struct {
	mq  MessageQueue
	sub *subscription // nil in assign mode: take every message

	// Guarded by LitePull.mu.
	lockTried      bool // a lock request was sent: release must unlock
	locked         bool
	lockValidUntil time.Time
	active         bool  // start offset known, pull task running
	dropped        bool  // no longer ours: nothing more is cached or handed out
	pullOffset     int64 // next offset to pull
	consumeOffset  int64 // offset past what Poll has handed out
	committed      int64 // last offset committed by the user (auto-commit off); -1 none
	persisted      int64 // last offset written to the store; -1 none
	seekOffset     int64 // seek requested before the queue became active; -1 none
	cache          []*batch
	count          int
	bytes          int64
	gen            uint64 // bumped by seeks: results of pulls started before are dropped
	taskCancel     context.CancelFunc
	lastPull       time.Time
	wake           chan struct{} // Poll made room, Resume: a waiting task may pull again
	restart        chan struct{} // Seek: stop waiting for the pull in flight
}

// batch is the result of one pull: its messages and the offset after it. A batch without
// messages (everything filtered out, or an offset correction) only carries the offset.
type batch struct {
	msgs  []*Message
	next  int64
	bytes int64
}

func newQueue(mq MessageQueue, sub *subscription) *queue {
	return &queue{mq: mq, sub: sub, committed: -1, persisted: -1, seekOffset: -1, wake: make(chan struct{}, 1), restart: make(chan struct{}, 1)}
}

func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// NewLitePull returns a lite-pull consumer of group, in state CreateJust. Subscribe or Assign,
// then Start.
func NewLitePull(group string, opts ...Option) (*LitePull, error) {
	if group == "" {
		return nil, fmt.Errorf("%w: empty consumer group", ErrInvalidArgument)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	l := &LitePull{
		group:          group,
		cfg:            cfg,
		pullSem:        make(chan struct{}, cfg.pullGoroutines),
		rebalanceCh:    make(chan struct{}, 1),
		subs:           map[string]*subscription{},
		assigned:       map[MessageQueue]bool{},
		paused:         map[MessageQueue]bool{},
		queues:         map[MessageQueue]*queue{},
		dataCh:         make(chan struct{}),
		topicQueues:    map[string][]MessageQueue{},
		topicListeners: map[string][]func(string, []MessageQueue){},
		previous:       map[string]map[string][]MessageQueue{},
		handover:       map[MessageQueue]handover{},
		parked:         map[MessageQueue]int{},
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	var err error
	if l.cl, l.ownsClient, err = client.Open(cfg.shared, cfg.client); err != nil {
		return nil, fmt.Errorf("consumer %q: %w", group, err)
	}
	l.log = l.cl.Logger().With("group", group)
	if cfg.model == Broadcasting {
		ls, err := openLocalStore(cfg.offsetDir, group)
		if err != nil {
			return nil, fmt.Errorf("consumer %q: %w", group, err)
		}
		l.store = ls
	} else {
		l.store = &remoteStore{cl: l.cl, group: group}
	}
	return l, nil
}

// Group is the consumer group.
func (l *LitePull) Group() string { return l.group }

// ClientID is the id the brokers know this consumer by, "ip@instance".
func (l *LitePull) ClientID() string { return l.cl.ID() }

// State is the lifecycle state.
func (l *LitePull) State() State { return State(l.state.Load()) }

func (l *LitePull) checkRunning() error {
	if s := l.State(); s != Running {
		return fmt.Errorf("%w (state %s)", ErrNotRunning, s)
	}
	return nil
}

// Start connects, registers the consumer in its group and starts pulling. A consumer starts
// once: Start on a consumer in any state but CreateJust fails with ErrBadState. If Start fails
// the consumer is left in StartFailed.
//
// Start does not fail because a subscribed topic does not exist yet: its route is fetched
// again on every rebalance and metadata check.
func (l *LitePull) Start(ctx context.Context) (err error) {
	l.startMu.Lock()
	defer l.startMu.Unlock()
	if s := l.State(); s != CreateJust {
		return fmt.Errorf("start consumer %q: %w: %s", l.group, ErrBadState, s)
	}
	l.state.Store(int32(StartFailed))
	defer func() {
		if err != nil {
			l.cancel()
			if l.ownsClient {
				_ = l.cl.Close(ctx)
			}
			err = fmt.Errorf("start consumer %q: %w", l.group, err)
		}
	}()
	if err := l.cl.Start(); err != nil { // a shared client may already run: Start is idempotent
		return err
	}
	// Set before registering: the client may call the hooks from then on.
	l.started = time.Now()
	if l.cfg.consumeFrom == ConsumeFromTimestamp && l.cfg.consumeTS.IsZero() {
		l.cfg.consumeTS = l.started.Add(-DefaultConsumeTimestampAgo)
	}
	if err := l.cl.RegisterConsumer(l.group, (*hooks)(l)); err != nil {
		return err
	}
	for _, topic := range l.topics() {
		if r, err := l.cl.Route(ctx, topic); err != nil {
			l.log.Warn("no route for topic yet", "topic", topic, "err", err)
		} else {
			l.setTopicQueues(topic, r.SubscribeQueues, false)
		}
	}
	if err := l.cl.SendHeartbeat(ctx); err != nil {
		l.log.Warn("first heartbeat failed", "err", err)
	}
	l.state.Store(int32(Running))
	l.wg.Add(2)
	go l.rebalanceLoop()
	go l.every(l.cfg.metadataCheck, l.checkMetadata)
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

// Shutdown stops the consumer: Poll stops handing out messages, pulling stops, the offsets of
// every owned queue are committed, their locks released, and the consumer leaves its group on
// every broker, which tells the other members to rebalance at once. It waits for every
// goroutine of the consumer, bounded by ctx for the network calls. Shutting down a consumer
// that is not running does nothing.
func (l *LitePull) Shutdown(ctx context.Context) error {
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
	err := l.release(ctx, all)
	if uerr := l.cl.UnregisterConsumer(ctx, l.group); uerr != nil {
		err = errors.Join(err, uerr)
	}
	if l.ownsClient {
		err = errors.Join(err, l.cl.Close(ctx))
	}
	l.log.Info("consumer shut down")
	if err != nil {
		return fmt.Errorf("shutdown consumer %q: %w", l.group, err)
	}
	return nil
}

// Subscribe subscribes to topic with a tag expression: "*" or "" for every message, or tags
// separated by "||". Subscribing again to a topic replaces its expression. It may be called
// before or after Start; once running, the group rebalances at once.
func (l *LitePull) Subscribe(topic, expr string) error {
	return l.SubscribeSelector(topic, TagSelector(expr))
}

// SubscribeSelector subscribes to topic with a selector.
func (l *LitePull) SubscribeSelector(topic string, sel Selector) error {
	if topic == "" {
		return fmt.Errorf("%w: empty topic", ErrInvalidArgument)
	}
	if sel == nil {
		return fmt.Errorf("%w: nil selector", ErrInvalidArgument)
	}
	if s := l.State(); s != CreateJust && s != Running {
		return fmt.Errorf("subscribe %q: %w (state %s)", topic, ErrNotRunning, s)
	}
	l.mu.Lock()
	if l.mode == modeAssign {
		l.mu.Unlock()
		return fmt.Errorf("subscribe %q: %w", topic, ErrSubscribeAndAssign)
	}
	l.mode = modeSubscribe
	sub := newSubscription(topic, sel)
	l.subs[topic] = sub
	for _, q := range l.queues {
		if q.mq.Topic == topic {
			q.sub = sub
		}
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
	return nil
}

// Unsubscribe drops the subscription to topic; its queues are committed and released at the
// next rebalance, which runs at once.
func (l *LitePull) Unsubscribe(topic string) error {
	l.mu.Lock()
	delete(l.subs, topic)
	if len(l.subs) == 0 && l.mode == modeSubscribe {
		l.mode = modeNone
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
	return nil
}

// Assign makes the consumer read exactly queues, without sharing them with the group: no
// rebalance, no hand-over locks. Assigning again replaces the set; an empty set releases every
// queue. Assign fails with ErrSubscribeAndAssign on a consumer with subscriptions.
func (l *LitePull) Assign(queues []MessageQueue) error {
	if s := l.State(); s != CreateJust && s != Running {
		return fmt.Errorf("assign: %w (state %s)", ErrNotRunning, s)
	}
	for _, mq := range queues {
		if mq.Topic == "" || mq.BrokerName == "" || mq.QueueID < 0 {
			return fmt.Errorf("%w: assign: bad queue %v", ErrInvalidArgument, mq)
		}
	}
	l.mu.Lock()
	if l.mode == modeSubscribe {
		l.mu.Unlock()
		return fmt.Errorf("assign: %w", ErrSubscribeAndAssign)
	}
	l.assigned = map[MessageQueue]bool{}
	for _, mq := range queues {
		l.assigned[mq] = true
	}
	l.mode = modeAssign
	if len(queues) == 0 {
		l.mode = modeNone
	}
	l.mu.Unlock()
	l.triggerRebalance()
	return nil
}

// Assignment returns the queues assigned to this consumer, sorted: by the last rebalance, or
// by Assign. With hand-over locks, a queue just assigned may still be waiting for its
// previous owner to release it.
func (l *LitePull) Assignment() []MessageQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Collect(maps.Keys(l.queues))
	slices.SortFunc(out, MessageQueue.Compare)
	return out
}

// Poll returns the messages of one pull of one owned queue, and moves that queue's consume
// offset past them: with auto-commit they count as consumed from now on. It waits for
// messages until ctx ends (returning ctx's error) or for the poll timeout (returning no
// messages and no error). Queues take turns, so one busy queue cannot starve the others.
func (l *LitePull) Poll(ctx context.Context) ([]*Message, error) {
	if err := l.checkRunning(); err != nil {
		return nil, err
	}
	timer := time.NewTimer(l.cfg.pollTimeout)
	defer timer.Stop()
	for {
		l.mu.Lock()
		if l.closing {
			l.mu.Unlock()
			return nil, fmt.Errorf("poll: %w", ErrNotRunning)
		}
		msgs, q := l.takeLocked(time.Now())
		ch := l.dataCh
		if msgs == nil {
			l.dataWaited = true
		}
		l.mu.Unlock()
		if msgs != nil {
			q.signal() // its pull task may be waiting for room
			return msgs, nil
		}
		select {
		case <-ch:
		case <-timer.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// takeLocked hands out the first cached batch of the next queue that has one.
func (l *LitePull) takeLocked(now time.Time) ([]*Message, *queue) {
	n := len(l.order)
	for i := range n {
		idx := (l.cursor + i) % n
		q := l.order[idx]
		if !l.consumableLocked(q, now) {
			continue
		}
		q.skipEmptyLocked()
		if len(q.cache) == 0 {
			continue
		}
		b := q.cache[0]
		q.cache[0] = nil
		q.cache = q.cache[1:]
		q.count -= len(b.msgs)
		q.bytes -= b.bytes
		l.cachedBatches--
		q.consumeOffset = b.next
		q.skipEmptyLocked()
		l.cursor = idx + 1
		return b.msgs, q
	}
	return nil, nil
}

// consumableLocked reports whether q's messages may be handed out now.
func (l *LitePull) consumableLocked(q *queue, now time.Time) bool {
	if !q.active || q.dropped || l.paused[q.mq] {
		return false
	}
	return !l.lockedMode() || (q.locked && now.Before(q.lockValidUntil))
}

// lockedMode reports whether owned queues need a hand-over lock: subscriptions in clustering
// with hand-over locks on. Assigned queues are nobody else's business.
func (l *LitePull) lockedMode() bool { return l.cfg.handoverLocks && l.mode == modeSubscribe }

// skipEmptyLocked applies the offsets of the offset-only batches at the head of the cache.
func (q *queue) skipEmptyLocked() {
	for len(q.cache) > 0 && len(q.cache[0].msgs) == 0 {
		q.consumeOffset = q.cache[0].next
		q.cache[0] = nil
		q.cache = q.cache[1:]
	}
}

// clearCacheLocked forgets every cached batch of q.
func (l *LitePull) clearCacheLocked(q *queue) {
	for _, b := range q.cache {
		if len(b.msgs) > 0 {
			l.cachedBatches--
		}
	}
	q.cache, q.count, q.bytes = nil, 0, 0
}

// Seek moves the consume position of an assigned queue to offset, which must lie within the
// queue's [min offset, max offset]. Cached messages of the queue are dropped and the next Poll
// of it starts at offset. With auto-commit the new position is committed at the next commit.
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

// Pause stops pulling the given queues and handing out their messages, until Resume. Pausing
// outlives rebalances: a paused queue stays paused if it is reassigned later.
func (l *LitePull) Pause(queues ...MessageQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, mq := range queues {
		l.paused[mq] = true
	}
}

// Resume undoes Pause.
func (l *LitePull) Resume(queues ...MessageQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, mq := range queues {
		delete(l.paused, mq)
		if q, ok := l.queues[mq]; ok {
			q.signal()
		}
	}
	l.wakePollersLocked()
}

// wakePollersLocked wakes every waiting Poll.
func (l *LitePull) wakePollersLocked() {
	if l.dataWaited {
		close(l.dataCh)
		l.dataCh = make(chan struct{})
		l.dataWaited = false
	}
}

// Commit commits, for every owned queue, the offset past the messages Poll has handed out.
func (l *LitePull) Commit(ctx context.Context) error {
	if err := l.checkRunning(); err != nil {
		return err
	}
	return l.commitAll(ctx, false)
}

// commitAll persists the consume offset of every owned, active queue (whose lock is still
// valid); onlyChanged skips those already persisted.
func (l *LitePull) commitAll(ctx context.Context, onlyChanged bool) error {
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	now := time.Now()
	offsets := map[MessageQueue]int64{}
	l.mu.Lock()
	for mq, q := range l.queues {
		if !q.active || q.dropped || (l.lockedMode() && !(q.locked && now.Before(q.lockValidUntil))) {
			continue
		}
		q.skipEmptyLocked()
		if onlyChanged && q.consumeOffset == q.persisted {
			continue
		}
		q.committed = q.consumeOffset
		offsets[mq] = q.consumeOffset
	}
	l.mu.Unlock()
	return l.persistLocked(ctx, offsets)
}

// persistLocked writes offsets to the store and records them as persisted. commitMu is held.
func (l *LitePull) persistLocked(ctx context.Context, offsets map[MessageQueue]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	failed := l.store.persist(ctx, offsets)
	l.mu.Lock()
	for mq, off := range offsets {
		if q, ok := l.queues[mq]; ok && failed[mq] == nil {
			q.persisted = off
		}
	}
	l.mu.Unlock()
	if len(failed) == 0 {
		return nil
	}
	errs := make([]error, 0, len(failed))
	for _, err := range failed {
		errs = append(errs, err)
	}
	return fmt.Errorf("commit offsets of %d queues: %w", len(failed), errors.Join(errs...))
}

// CommitOffsets commits the given offsets of owned queues. A queue not owned fails the whole
// call with ErrNotAssigned before anything is committed.
func (l *LitePull) CommitOffsets(ctx context.Context, offsets map[MessageQueue]int64) error {
	if err := l.checkRunning(); err != nil {
		return err
	}
	l.commitMu.Lock()
	defer l.commitMu.Unlock()
	now := time.Now()
	l.mu.Lock()
	for mq, off := range offsets {
		q, ok := l.queues[mq]
		if !ok || !q.active || (l.lockedMode() && !(q.locked && now.Before(q.lockValidUntil))) {
			// Not ours, or our lock on it may have lapsed: its offset may be another
			// member's to write.
			l.mu.Unlock()
			return fmt.Errorf("commit %s: %w", mq, ErrNotAssigned)
		}
		if off < 0 {
			l.mu.Unlock()
			return fmt.Errorf("commit %s: %w: negative offset %d", mq, ErrInvalidArgument, off)
		}
	}
	for mq, off := range offsets {
		l.queues[mq].committed = off
	}
	l.mu.Unlock()
	return l.persistLocked(ctx, maps.Clone(offsets))
}

// Committed returns the offset stored for mq (on the broker, or in the local file in
// broadcasting), or -1 when there is none.
func (l *LitePull) Committed(ctx context.Context, mq MessageQueue) (int64, error) {
	if err := l.checkRunning(); err != nil {
		return 0, err
	}
	off, err := l.store.read(ctx, mq)
	if err != nil {
		return 0, fmt.Errorf("committed offset of %s: %w", mq, err)
	}
	return off, nil
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

// FetchMessageQueues asks the name servers for topic's readable queues, sorted.
func (l *LitePull) FetchMessageQueues(ctx context.Context, topic string) ([]MessageQueue, error) {
	if err := l.checkRunning(); err != nil {
		return nil, err
	}
	r, err := l.cl.UpdateRoute(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("fetch queues of %q: %w", topic, err)
	}
	return slices.Clone(r.SubscribeQueues), nil
}

// RegisterTopicMessageQueueChangeListener calls fn with topic's readable queues every time
// the metadata check (or a route refresh) finds that they changed. The queue set known when
// registering is not reported. fn runs on a consumer or client goroutine and must not block.
func (l *LitePull) RegisterTopicMessageQueueChangeListener(ctx context.Context, topic string, fn func(topic string, queues []MessageQueue)) error {
	if topic == "" || fn == nil {
		return fmt.Errorf("%w: empty topic or nil listener", ErrInvalidArgument)
	}
	l.mu.Lock()
	l.topicListeners[topic] = append(l.topicListeners[topic], fn)
	l.mu.Unlock()
	if l.State() == Running {
		r, err := l.cl.Route(ctx, topic)
		if err != nil {
			return fmt.Errorf("register listener of %q: %w", topic, err)
		}
		l.setTopicQueues(topic, r.SubscribeQueues, false)
	}
	return nil
}

// setTopicQueues records topic's readable queues. With notify, a change triggers a
// rebalance when the topic is subscribed (its first appearance too: a topic created after
// Subscribe), and a change from a known set is passed to the topic listeners.
func (l *LitePull) setTopicQueues(topic string, queues []MessageQueue, notify bool) {
	l.mu.Lock()
	old, known := l.topicQueues[topic]
	if known && slices.Equal(old, queues) {
		l.mu.Unlock()
		return
	}
	l.topicQueues[topic] = slices.Clone(queues)
	listeners := slices.Clone(l.topicListeners[topic])
	_, subscribed := l.subs[topic]
	l.mu.Unlock()
	if !notify {
		return
	}
	if known {
		l.log.Info("topic queues changed", "topic", topic, "queues", len(queues))
		for _, fn := range listeners {
			fn(topic, slices.Clone(queues))
		}
	}
	if subscribed {
		l.triggerRebalance()
	}
}

// triggerRebalance asks the rebalance goroutine to run soon; triggers coalesce.
func (l *LitePull) triggerRebalance() {
	select {
	case l.rebalanceCh <- struct{}{}:
	default:
	}
}

// every runs fn every d until Shutdown, on a goroutine counted in wg.
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

// checkMetadata fetches the routes of the consumer's topics (every metadata-check interval).
func (l *LitePull) checkMetadata() {
	for _, topic := range l.topics() {
		r, err := l.cl.UpdateRoute(l.ctx, topic)
		if err != nil {
			l.log.Debug("topic metadata check failed", "topic", topic, "err", err)
			continue
		}
		l.setTopicQueues(topic, r.SubscribeQueues, true)
	}
}

// autoCommit commits changed offsets (every auto-commit interval).
func (l *LitePull) autoCommit() {
	if err := l.commitAll(l.ctx, true); err != nil && l.ctx.Err() == nil {
		l.log.Warn("auto-commit failed", "err", err)
	}
}

// hooks is the face the consumer shows the client core (client.Consumer), kept off
// LitePull's own method set.
type hooks LitePull

func (h *hooks) ConsumerData() protocol.ConsumerData {
	l := (*LitePull)(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	cd := protocol.ConsumerData{
		GroupName:           l.group,
		ConsumeType:         protocol.ConsumeActively,
		MessageModel:        l.cfg.model.String(),
		ConsumeFromWhere:    l.cfg.consumeFrom.String(),
		SubscriptionDataSet: []protocol.SubscriptionData{},
	}
	for _, t := range slices.Sorted(maps.Keys(l.subs)) {
		cd.SubscriptionDataSet = append(cd.SubscriptionDataSet, l.subs[t].data())
	}
	return cd
}

func (h *hooks) NotifyConsumerIDsChanged() { (*LitePull)(h).triggerRebalance() }

// ConnectionLost: the broker dropped this member and released its queue locks when the
// connection closed, and another member may take them over at once. Stop handing out the
// queues of those brokers now, and have the rebalance goroutine heartbeat (rejoin) and renew
// the locks before they are read again; a queue whose lock went to another member is dropped
// without committing, as on any lost lock.
func (h *hooks) ConnectionLost(brokers []string) {
	l := (*LitePull)(h)
	l.mu.Lock()
	l.lockEpoch++
	for _, q := range l.queues {
		if q.locked && slices.Contains(brokers, q.mq.BrokerName) {
			q.lockValidUntil = time.Time{}
			l.renewNow = true
		}
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
}

func (h *hooks) RouteChanged(topic string, queues []protocol.MessageQueue) {
	(*LitePull)(h).setTopicQueues(topic, queues, true)
}

func (h *hooks) RunningInfo() *protocol.ConsumerRunningInfo {
	l := (*LitePull)(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	info := &protocol.ConsumerRunningInfo{
		Properties: map[string]string{
			"PROP_CONSUME_TYPE":              protocol.ConsumeActively,
			"PROP_CONSUMER_START_TIMESTAMP":  strconv.FormatInt(l.started.UnixMilli(), 10),
			"PROP_CLIENT_VERSION":            "flowd",
			"PROP_THREADPOOL_CORE_SIZE":      strconv.Itoa(l.cfg.pullGoroutines),
			"messageModel":                   l.cfg.model.String(),
			"consumeFromWhere":               l.cfg.consumeFrom.String(),
			"allocateMessageQueueStrategy":   l.cfg.strategy.Name(),
			"handoverLocks":                  strconv.FormatBool(l.lockedMode()),
			"pullBatchSize":                  strconv.Itoa(l.cfg.pullBatchSize),
			"autoCommit":                     strconv.FormatBool(l.cfg.autoCommit),
			"autoCommitIntervalMillis":       strconv.FormatInt(l.cfg.autoCommitInt.Milliseconds(), 10),
			"pullThresholdForQueue":          strconv.Itoa(l.cfg.thresholdQueue),
			"pullThresholdSizeForQueueBytes": strconv.FormatInt(l.cfg.thresholdSize, 10),
		},
		MQTable: map[protocol.MessageQueue]protocol.ProcessQueueInfo{},
	}
	for _, t := range slices.Sorted(maps.Keys(l.subs)) {
		info.SubscriptionSet = append(info.SubscriptionSet, l.subs[t].data())
	}
	for mq, q := range l.queues {
		pi := protocol.ProcessQueueInfo{
			CommitOffset:       q.consumeOffset,
			CachedMsgCount:     int64(q.count),
			CachedMsgSizeInMiB: q.bytes >> 20,
			Locked:             q.locked,
			Dropped:            q.dropped,
			LastPullTimestamp:  q.lastPull.UnixMilli(),
		}
		if first, last, ok := q.span(); ok {
			pi.CachedMsgMinOffset, pi.CachedMsgMaxOffset = first, last
		}
		info.MQTable[mq] = pi
	}
	return info
}

func (h *hooks) ResetOffset(topic string, offsets map[protocol.MessageQueue]int64) {
	l := (*LitePull)(h)
	for mq, off := range offsets {
		if mq.Topic != topic {
			continue
		}
		if err := l.seekTo(mq, off); err != nil {
			l.log.Debug("reset offset of a queue not owned", "queue", mq.String(), "offset", off)
		}
	}
}

// span returns the first and last offsets of q's cached messages.
func (q *queue) span() (first, last int64, ok bool) {
	for _, b := range q.cache {
		if len(b.msgs) > 0 {
			if !ok {
				first, ok = b.msgs[0].QueueOffset, true
			}
			last = b.msgs[len(b.msgs)-1].QueueOffset
		}
	}
	return first, last, ok
}
