package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/internal/clientcore"
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
//	startMu → commitMu → a queue's commit lock (several in queue order) → mu
//	the client core's heartbeat lock → mu   (the core calls ConsumerData with it held)
//
// startMu serializes Start and Close. commitMu orders every write of offsets to the offset
// store with queue hand-overs (commit, then unlock), and is held across that network I/O:
// for writing by hand-overs and by Commit and auto-commit, for reading by CommitOffsets,
// whose calls for different queues go out together and those for one queue one after
// another, under that queue's commit lock (commits). mu guards the consumer's in-memory state and is never held across network I/O, while
// calling into the client core or while calling user code. Queues join and leave the owned
// set only on the rebalance goroutine (and in Close, after that goroutine has ended), so a
// rebalance never races another rebalance.
type LitePull struct {
	group      string
	cfg        config
	log        *slog.Logger
	cl         *clientcore.Client
	ownsClient bool
	store      offsetStore

	state   atomic.Int32
	startMu sync.Mutex
	started time.Time

	ctx         context.Context // cancelled by Close
	cancel      context.CancelFunc
	wg          sync.WaitGroup // loops and pull tasks
	pullSem     chan struct{}
	rebalanceCh chan struct{}
	metadataCh  chan struct{} // Subscribe while running: check the routes now

	commitMu sync.RWMutex
	commits  map[MessageQueue]*queueCommit // guarded by mu: the commit locks of queues being committed

	mu             sync.Mutex
	closing        bool
	mode           subMode
	subs           map[string]*subscription
	assigned       map[MessageQueue]bool
	assignSubs     map[string]*subscription // by topic: the selectors of assigned queues (SetAssignSelector)
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
	topicsRead     map[string]bool // topics the group has stored offsets in (see startOffset)
	topicListeners map[string][]func(topic string, queues []MessageQueue)
	settling       bool                      // the group's lock table was not yet read as settled: allocate again soon
	calmReads      int                       // fixed-point reads of the lock table in a row
	idleReads      int                       // reads of an unsettled table in a row that changed nothing here
	handover       map[MessageQueue]handover // dropped queues whose commit failed: commit, then unlock
	revoking       map[MessageQueue]*queue   // detached queues the revoke function is being told of
	parked         map[MessageQueue]int      // long-polling pulls in flight, by queue (see pullTask)
	failures       map[MessageQueue]error    // refused pulls Poll has still to report (see refusal)
	alloc          allocStatus               // the group's agreement on its allocator, as last read
	masterDown     map[string]time.Time      // by broker name: pulls go to a replica until then (replicareads.go)
	reads          map[readMember]*ReadStat  // pulls answered, by broker member (ReadStats)

	rebalances atomic.Uint64 // rebalances done, for tests to wait on

	// Owned by the rebalance goroutine.
	renewTick <-chan time.Time     // the lock-renewal ticker, served while a strategy runs
	allocMemo map[string]allocMemo // by topic: the last group assignment computed
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
	sub *subscription // nil in assign mode without SetAssignSelector: take every message

	// Guarded by LitePull.mu.
	lockTried      bool // a lock request was sent: release must unlock
	locked         bool
	lockValidUntil time.Time
	lockLost       bool // the broker released the lock (lost connection): a renewal is a new lock
	resume         *resumePoint
	active         bool  // start offset known, pull task running
	dropped        bool  // no longer ours: nothing more is cached or handed out
	pullOffset     int64 // next offset to pull
	consumeOffset  int64 // offset past what Poll has handed out
	committed      int64 // last offset committed by the user (auto-commit off); -1 none
	persisted      int64 // last offset written to the store; -1 none
	floor          int64 // highest offset sent to the store since the queue was activated or sought; -1 none
	seekOffset     int64 // seek requested before the queue became active; -1 none
	cache          []*batch
	count          int
	bytes          int64
	gen            uint64 // bumped by seeks: results of pulls started before are dropped
	taskCancel     context.CancelFunc
	lastPull       time.Time
	refused        bool          // the last pull was refused for good (see refusal)
	readFrom       int64         // the broker member the last answer suggested (replicareads.go)
	wake           chan struct{} // Poll made room, Resume: a waiting task may pull again
	restart        chan struct{} // Seek: stop waiting for the pull in flight
}

// resumePoint is where a queue whose lock was lost and granted again stood: the offset this
// member last stored, and the offset past what Poll had handed out. If the stored offset is
// still the one this member wrote, nobody committed the queue meanwhile and reading resumes
// past what was handed out; otherwise another member read and committed it, and reading
// starts at its commit.
type resumePoint struct {
	persisted int64
	consume   int64
}

// batch is the result of one pull: its messages and the offset after it. A batch without
// messages (everything filtered out, or an offset correction) only carries the offset.
type batch struct {
	msgs  []*Message
	next  int64
	bytes int64
}

func newQueue(mq MessageQueue, sub *subscription) *queue {
	return &queue{mq: mq, sub: sub, committed: -1, persisted: -1, floor: -1, seekOffset: -1, wake: make(chan struct{}, 1), restart: make(chan struct{}, 1)}
}

// admitLocked reports whether off may be sent to the offset store for q, and records it as
// sent. Commits of a queue only move forward: calls from different goroutines are
// serialized but their order is not the order their offsets were reached in, and a commit
// whose answer never came may still land; an offset below one already sent is dropped.
// Only activating the queue again or a seek lowers the floor. LitePull.mu is held.
func (q *queue) admitLocked(off int64) bool {
	if off < q.floor {
		return false
	}
	q.floor = off
	return true
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
	if group == protocol.ReaderGroup {
		return nil, fmt.Errorf("%w: consumer group %q is the one of stateless reads: use NewReader", ErrInvalidArgument, group)
	}
	return newLitePull(group, false, opts)
}

func newLitePull(group string, reader bool, opts []Option) (*LitePull, error) {
	cfg := defaultConfig()
	cfg.reader = reader
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
		pullSem:        pullSlots(cfg.pullGoroutines),
		rebalanceCh:    make(chan struct{}, 1),
		metadataCh:     make(chan struct{}, 1),
		subs:           map[string]*subscription{},
		assigned:       map[MessageQueue]bool{},
		assignSubs:     map[string]*subscription{},
		paused:         map[MessageQueue]bool{},
		queues:         map[MessageQueue]*queue{},
		dataCh:         make(chan struct{}),
		topicQueues:    map[string][]MessageQueue{},
		topicsRead:     map[string]bool{},
		topicListeners: map[string][]func(string, []MessageQueue){},
		handover:       map[MessageQueue]handover{},
		revoking:       map[MessageQueue]*queue{},
		parked:         map[MessageQueue]int{},
		commits:        map[MessageQueue]*queueCommit{},
		failures:       map[MessageQueue]error{},
		masterDown:     map[string]time.Time{},
		reads:          map[readMember]*ReadStat{},
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	var err error
	l.cl, l.ownsClient, err = clientcore.Open(cfg.client, len(cfg.clientOpts), func() (*client.Client, error) {
		// RocketMQ's lite pull dials with its pull timeout; the user's options come after.
		return client.New(append([]client.Option{client.WithDialTimeout(DefaultPullTimeout)}, cfg.clientOpts...)...)
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %q: %w: %w", group, ErrInvalidOption, err)
	}
	l.log = l.cl.Logger().With("group", group)
	switch {
	case cfg.reader:
		l.store = readerStore{}
	case cfg.model == Broadcasting:
		ls, err := openLocalStore(cfg.offsetDir, group)
		if err != nil {
			return nil, fmt.Errorf("consumer %q: %w", group, err)
		}
		l.store = ls
	default:
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

// pullSlots is the semaphore of WithPullGoroutines, nil when no bound was asked for.
func pullSlots(n int) chan struct{} {
	if n <= 0 {
		return nil
	}
	return make(chan struct{}, n)
}
