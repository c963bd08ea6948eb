package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// Defaults of the lite-pull consumer's settings: RocketMQ's DefaultLitePullConsumer defaults,
// except where a comment says otherwise.
const (
	DefaultPullGoroutines            = 0 // no shared bound: one pull in flight per owned queue
	DefaultPullBatchSize             = 10
	DefaultPullThresholdForAll       = 10_000
	DefaultPullThresholdForQueue     = 1_000
	DefaultPullThresholdSizeForQueue = 100 << 20
	DefaultConsumeMaxSpan            = 2_000
	DefaultPollTimeout               = 5 * time.Second
	DefaultTopicMetadataCheck        = 30 * time.Second
	DefaultBrokerSuspend             = 20 * time.Second
	DefaultSuspendedPullTimeout      = 30 * time.Second
	DefaultAutoCommitInterval        = 5 * time.Second
	MinAutoCommitInterval            = time.Second
	DefaultRebalanceInterval         = 20 * time.Second
	DefaultConsumeTimestampAgo       = 30 * time.Minute

	// DefaultPullTimeout is the dial timeout of the client a consumer builds for itself
	// (WithClientOptions; client.WithDialTimeout sets another): RocketMQ's
	// consumerPullTimeoutMillis, which its lite-pull consumer uses as the connection timeout.
	DefaultPullTimeout = 10 * time.Second

	// DefaultFlowControlDelay is how long a pull task waits when one of the consumer's own
	// thresholds (messages for all queues, messages or bytes for its queue, span) is exceeded.
	DefaultFlowControlDelay = 50 * time.Millisecond
	// DefaultBrokerFlowControlDelay is how long a pull task waits after the broker answered
	// FLOW_CONTROL.
	DefaultBrokerFlowControlDelay = 20 * time.Millisecond
	// DefaultPullErrorDelay is how long a pull task waits after any other failure
	// (RocketMQ's pullTimeDelayMillsWhenException).
	DefaultPullErrorDelay = time.Second

	// DefaultLockLease is the broker's default queue-lock lease (broker.Config.LockLease).
	DefaultLockLease = 60 * time.Second
	// DefaultLockRetryInterval is how often a queue waiting for its previous owner to release
	// it is tried again.
	DefaultLockRetryInterval = 500 * time.Millisecond
	// DefaultAllocateTimeout bounds one computation of the group's assignment by the
	// allocation strategy (a flowd setting: RocketMQ's strategies are plain Java calls).
	DefaultAllocateTimeout = 10 * time.Second
)

// MessageModel says how a group's members share a topic.
type MessageModel int

const (
	// Clustering shares the queues among the group's members: each queue has one owner, and
	// offsets live on the broker.
	Clustering MessageModel = iota
	// Broadcasting gives every member every queue; each member keeps its own offsets in a
	// local file.
	Broadcasting
)

func (m MessageModel) String() string {
	if m == Broadcasting {
		return protocol.Broadcasting
	}
	return protocol.Clustering
}

// ConsumeFrom says where a group starts in a queue it has no stored offset for.
type ConsumeFrom int

const (
	// ConsumeFromLast starts at the queue's end: only messages stored from now on.
	ConsumeFromLast ConsumeFrom = iota
	// ConsumeFromFirst starts at the queue's first message still stored.
	ConsumeFromFirst
	// ConsumeFromTimestamp starts at the first message stored at or after the timestamp set
	// with WithConsumeTimestamp (default: 30 minutes before Start).
	ConsumeFromTimestamp
)

func (c ConsumeFrom) String() string {
	switch c {
	case ConsumeFromFirst:
		return protocol.ConsumeFromFirstOffset
	case ConsumeFromTimestamp:
		return protocol.ConsumeFromTimestamp
	}
	return protocol.ConsumeFromLastOffset
}

// Option configures a LitePull; pass options to NewLitePull.
type Option func(*config) error

type config struct {
	client     *client.Client  // WithClient: shared, never closed by the consumer
	clientOpts []client.Option // WithClientOptions: of the client the consumer builds

	reader        bool // NewReader: assigned queues only, no group, no offsets
	model         MessageModel
	strategy      allocate.Strategy
	consumeFrom   ConsumeFrom
	consumeTS     time.Time
	autoCommit    bool
	autoCommitInt time.Duration

	pullGoroutines    int
	pullBatchSize     int
	thresholdAll      int
	thresholdQueue    int
	thresholdSize     int64
	maxSpan           int64
	pollTimeout       time.Duration
	metadataCheck     time.Duration
	brokerSuspend     time.Duration
	suspendedTimeout  time.Duration
	flowControlDelay  time.Duration
	brokerFlowDelay   time.Duration
	pullErrorDelay    time.Duration
	rebalanceInterval time.Duration
	allocateTimeout   time.Duration

	handoverLocks    bool
	handoverLocksSet bool
	lockLease        time.Duration
	lockRenew        time.Duration
	lockRetry        time.Duration

	offsetDir     string
	queueListener func(topic string, queues []protocol.MessageQueue)
	onRevoked     func(ctx context.Context, queues []protocol.MessageQueue)
	maxBodySize   int
	maxReconsume  int32
	verifyCRC     bool
}

func defaultConfig() config {
	return config{
		strategy:          allocate.Averagely(),
		autoCommit:        true,
		autoCommitInt:     DefaultAutoCommitInterval,
		pullGoroutines:    DefaultPullGoroutines,
		pullBatchSize:     DefaultPullBatchSize,
		thresholdAll:      DefaultPullThresholdForAll,
		thresholdQueue:    DefaultPullThresholdForQueue,
		thresholdSize:     DefaultPullThresholdSizeForQueue,
		maxSpan:           DefaultConsumeMaxSpan,
		pollTimeout:       DefaultPollTimeout,
		metadataCheck:     DefaultTopicMetadataCheck,
		brokerSuspend:     DefaultBrokerSuspend,
		suspendedTimeout:  DefaultSuspendedPullTimeout,
		flowControlDelay:  DefaultFlowControlDelay,
		brokerFlowDelay:   DefaultBrokerFlowControlDelay,
		pullErrorDelay:    DefaultPullErrorDelay,
		rebalanceInterval: DefaultRebalanceInterval,
		allocateTimeout:   DefaultAllocateTimeout,
		lockLease:         DefaultLockLease,
		lockRetry:         DefaultLockRetryInterval,
		maxBodySize:       protocol.MaxFrameSize,
		maxReconsume:      -1,
	}
}

func (c *config) validate() error {
	if c.reader {
		if c.model == Broadcasting {
			return fmt.Errorf("%w: a reader keeps no offsets, local or remote: broadcasting does not apply", ErrInvalidOption)
		}
		// Nothing to commit, nobody to hand a queue over to.
		c.autoCommit, c.handoverLocks, c.handoverLocksSet = false, false, true
	}
	if c.suspendedTimeout <= c.brokerSuspend {
		return fmt.Errorf("%w: the suspended pull timeout %v must exceed the broker suspend time %v", ErrInvalidOption, c.suspendedTimeout, c.brokerSuspend)
	}
	if !c.handoverLocksSet {
		c.handoverLocks = c.model == Clustering
	}
	if c.model == Broadcasting {
		c.handoverLocks = false
	}
	if c.lockRenew == 0 {
		c.lockRenew = c.lockLease / 3
	}
	if c.handoverLocks && c.lockRenew >= c.lockLease/2 {
		return fmt.Errorf("%w: the lock renew interval %v must be below half the lock lease %v", ErrInvalidOption, c.lockRenew, c.lockLease)
	}
	return nil
}

func positive[T int | int64 | time.Duration](name string, v T) error {
	if v <= 0 {
		return fmt.Errorf("%w: %s must be positive, got %v", ErrInvalidOption, name, v)
	}
	return nil
}

// WithClient makes the consumer use cl, a client core it shares with other producers and
// consumers of the process, instead of building its own: a daemon hosting many of them then
// keeps one connection per broker, and one heartbeat names all their groups. cl's settings
// (name servers, client id, logger, JSON headers, intervals, timeouts) are then the
// consumer's. The consumer registers its group into cl on Start and unregisters it on Close,
// after handing its queues over, but never closes cl: its creator does, after every producer
// and consumer using it.
//
// The client id names the member of the group, so two consumers of one group need two
// clients (a client registers a group once; Start fails for the second). One of WithClient
// and WithClientOptions is required; they exclude each other.
func WithClient(cl *client.Client) Option {
	return func(c *config) error { c.client = cl; return nil }
}

// WithClientOptions makes the consumer build a client core of its own from opts, and close
// it on Close: client.WithNameServers (required), client.WithLogger, client.WithInstanceName
// and client.WithClientIP (the member's id), client.WithJSONHeaders,
// client.WithHeartbeatInterval (how soon a broker notices a silent member),
// client.WithRouteRefreshInterval, client.WithRequestTimeout (offset queries and commits,
// locks, member lists), client.WithDialTimeout. Each is documented in package client, the
// one place the settings a consumer and a producer share are written; options given in
// several calls add up.
//
//	c, err := consumer.NewLitePull("billing", consumer.WithClientOptions(
//		client.WithNameServers("127.0.0.1:9876"),
//		client.WithLogger(log),
//	))
//
// The dial timeout of such a client defaults to DefaultPullTimeout (10 s), RocketMQ's
// consumerPullTimeoutMillis, which its lite-pull consumer uses as the connection timeout; a
// long-polling pull itself is bounded by WithSuspendedPullTimeout. Its instance name
// defaults to a new unique one, so every consumer is a member of its own. One of
// WithClient and WithClientOptions is required; they exclude each other.
func WithClientOptions(opts ...client.Option) Option {
	return func(c *config) error { c.clientOpts = append(c.clientOpts, opts...); return nil }
}

// WithMessageModel chooses clustering (the default: the group's members share the queues,
// offsets live on the broker) or broadcasting (every member reads every queue, offsets live in
// a local file; see WithOffsetStoreDir).
func WithMessageModel(m MessageModel) Option {
	return func(c *config) error {
		if m != Clustering && m != Broadcasting {
			return fmt.Errorf("%w: unknown message model %d", ErrInvalidOption, m)
		}
		c.model = m
		return nil
	}
}

// WithAllocateStrategy sets how a rebalance shares a topic's queues among the group's members.
// Every member of a group must use the same strategy, or queues are read twice or not at all.
//
// Default allocate.Averagely(), RocketMQ's default.
//
// # Notes
//
// The strategy is given, as allocate.Request.Previous, the group's current assignment: the
// broker's lock table of the group's queues (GET_LOCK_OWNERS, a flowd extension). With
// hand-over locks every member locks each queue it reads, so that table is the assignment,
// and every member reads the same one, so sticky strategies (allocate.Sticky) agree across
// the group whatever joins and leaves each member happened to see. While queues change hands
// members read the table again every lock-retry interval until it is a fixed point of the
// strategy. Without hand-over locks (broadcasting, or WithHandoverLocks(false)), or against a
// broker that does not know the request, Previous is nil and sticky strategies fall back to
// their inner strategy.
//
// Each member reports its strategy's identity (allocate.Identity) in its heartbeat, and reads
// every member's from the same lock-table answer. While the members disagree (one runs
// another version of a Wasm allocator, say), every member allocates with allocate.Averagely
// instead, so the group never splits between two algorithms, until they agree again. The
// consumer's running info shows the identities and the strategy in use. A Wasm allocator
// (plugins.AllocatorStrategy) is used like any other strategy; wrap it with
// allocate.WithIdentity to report its module's digest too. The strategy computes the whole
// group's assignment once per change of its inputs (allocate.GroupStrategy saves the call
// per member), bounded by WithAllocateTimeout; held locks are renewed meanwhile.
func WithAllocateStrategy(s allocate.Strategy) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil allocate strategy", ErrInvalidOption)
		}
		c.strategy = s
		return nil
	}
}

// WithConsumeFrom sets where the group starts in a queue that has no stored offset: its end
// (ConsumeFromLast, the default), its first message (ConsumeFromFirst) or a point in time
// (ConsumeFromTimestamp). A stored offset always wins.
func WithConsumeFrom(from ConsumeFrom) Option {
	return func(c *config) error {
		if from < ConsumeFromLast || from > ConsumeFromTimestamp {
			return fmt.Errorf("%w: unknown consume-from %d", ErrInvalidOption, from)
		}
		c.consumeFrom = from
		return nil
	}
}

// WithConsumeTimestamp sets the time ConsumeFromTimestamp starts from. Default: 30 minutes
// before Start.
func WithConsumeTimestamp(t time.Time) Option {
	return func(c *config) error {
		c.consumeTS = t
		return nil
	}
}

// WithAutoCommit turns automatic offset commits on or off. Default on.
//
// With auto-commit, the offset past every message Poll has returned is committed every
// auto-commit interval, when a queue is taken away by a rebalance, and on Close: a polled
// message counts as consumed (RocketMQ's lite-pull semantics). Without it, only Commit and
// CommitOffsets commit, and a queue taken away is handed over at the offset last committed
// that way, so messages polled but not committed are read again by the next owner.
func WithAutoCommit(on bool) Option {
	return func(c *config) error {
		c.autoCommit = on
		return nil
	}
}

// WithAutoCommitInterval sets how often offsets are committed automatically. Default 5 s; the
// minimum is 1 s.
func WithAutoCommitInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < MinAutoCommitInterval {
			return fmt.Errorf("%w: auto-commit interval %v is below the minimum %v", ErrInvalidOption, d, MinAutoCommitInterval)
		}
		c.autoCommitInt = d
		return nil
	}
}

// WithPullGoroutines bounds how many pulls are in flight at once across the owned queues
// (RocketMQ's pullThreadNums). Each owned queue has its own pull task, with at most one pull
// in flight; with this bound, a task also waits for one of n slots before each pull.
//
// Default: no shared bound (DefaultPullGoroutines, 0), so the pulls in flight are at most
// the owned queues.
//
// # Notes
//
// A pull on a caught-up queue is parked by the broker for up to the suspend time
// (WithBrokerSuspend) and holds its slot meanwhile, as a Java pull thread would. With more
// queues than slots, a queue with new messages waits behind parked pulls of idle queues, up
// to the suspend time: a consumer of a topic with queues on several brokers owns more queues
// than Java's default of 20 soon enough, which is why flowd sets no bound by default. A
// parked pull costs the broker a parked request, not a request in flight (the remoting
// server bounds the two apart), and the consumer a pending call.
func WithPullGoroutines(n int) Option {
	return func(c *config) error {
		c.pullGoroutines = n
		return positive("pull goroutines", n)
	}
}

// WithPullBatchSize sets the most messages one pull asks for, which is also the most one Poll
// returns. Default 10; at most 1024.
func WithPullBatchSize(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 1024 {
			return fmt.Errorf("%w: pull batch size %d is outside 1..1024", ErrInvalidOption, n)
		}
		c.pullBatchSize = n
		return nil
	}
}

// WithVerifyBodyCRC makes the consumer check each pulled message's body against the CRC the
// broker stored with it, failing the pull (logged, retried after the pull error delay) on a
// mismatch. Off by default, as in RocketMQ's Java client, whose pulls decode with
// MessageDecoder.decodesBatch, which does not check the CRC: the broker checks bodies when
// it stores them and TCP checksums what travels, and the CRC over every body was a tenth of
// the consumer's CPU. Turn it on to detect corruption of stored messages on the read side.
func WithVerifyBodyCRC(verify bool) Option {
	return func(c *config) error {
		c.verifyCRC = verify
		return nil
	}
}

// WithPullThresholdForAll caps the messages cached for all queues together, counted as cached
// batches times the batch size; past it pulling pauses. Default 10 000.
func WithPullThresholdForAll(n int) Option {
	return func(c *config) error {
		c.thresholdAll = n
		return positive("pull threshold for all", n)
	}
}

// WithPullThresholdForQueue caps the messages cached for one queue; past it that queue's
// pulling pauses until Poll takes some. Default 1 000.
func WithPullThresholdForQueue(n int) Option {
	return func(c *config) error {
		c.thresholdQueue = n
		return positive("pull threshold for queue", n)
	}
}

// WithPullThresholdSizeForQueue caps the body bytes cached for one queue. Default 100 MiB.
func WithPullThresholdSizeForQueue(bytes int64) Option {
	return func(c *config) error {
		c.thresholdSize = bytes
		return positive("pull threshold size for queue", bytes)
	}
}

// WithConsumeMaxSpan caps the distance between the first and the last cached offset of a
// queue. Default 2 000.
func WithConsumeMaxSpan(n int64) Option {
	return func(c *config) error {
		c.maxSpan = n
		return positive("consume max span", n)
	}
}

// WithPollTimeout sets how long Poll waits for messages when its context allows longer.
// Default 5 s.
func WithPollTimeout(d time.Duration) Option {
	return func(c *config) error {
		c.pollTimeout = d
		return positive("poll timeout", d)
	}
}

// WithTopicMetadataCheckInterval sets how often the routes of subscribed topics are fetched to
// notice a changed queue set (which triggers a rebalance and the topic listeners). Default 30 s.
// A subscribed topic that does not exist yet is asked for more often: after 100 ms, doubling
// up to 2 s, so that a topic created after Subscribe is read within about 2 s.
func WithTopicMetadataCheckInterval(d time.Duration) Option {
	return func(c *config) error {
		c.metadataCheck = d
		return positive("topic metadata check interval", d)
	}
}

// WithBrokerSuspend sets how long the broker may park a pull that finds nothing (long
// polling). Default 20 s.
func WithBrokerSuspend(d time.Duration) Option {
	return func(c *config) error {
		c.brokerSuspend = d
		return positive("broker suspend", d)
	}
}

// WithSuspendedPullTimeout bounds, client-side, a pull the broker may park. It must exceed the
// broker suspend time. Default 30 s.
func WithSuspendedPullTimeout(d time.Duration) Option {
	return func(c *config) error {
		c.suspendedTimeout = d
		return positive("suspended pull timeout", d)
	}
}

// WithPullDelays sets the pull back-off: after the consumer's own flow control trips (default
// 50 ms), after the broker answered FLOW_CONTROL (default 20 ms), and after any other failure
// (default 1 s).
func WithPullDelays(flowControl, brokerFlowControl, onError time.Duration) Option {
	return func(c *config) error {
		c.flowControlDelay, c.brokerFlowDelay, c.pullErrorDelay = flowControl, brokerFlowControl, onError
		if flowControl <= 0 || brokerFlowControl <= 0 || onError <= 0 {
			return fmt.Errorf("%w: pull delays must be positive", ErrInvalidOption)
		}
		return nil
	}
}

// WithRebalanceInterval sets the period of the safety-net rebalance. Rebalances also run at
// once when the broker reports a membership change, when a topic's queues change, on
// Subscribe/Unsubscribe and on Start, so the timer only matters when a notification is lost.
// Default 20 s, RocketMQ's only trigger besides start.
func WithRebalanceInterval(d time.Duration) Option {
	return func(c *config) error {
		c.rebalanceInterval = d
		return positive("rebalance interval", d)
	}
}

// WithAllocateTimeout bounds one computation of the group's assignment by the allocation
// strategy: a Wasm allocator that runs longer is cancelled, and the consumer keeps its current
// assignment until the next rebalance. Default 10 s.
func WithAllocateTimeout(d time.Duration) Option {
	return func(c *config) error {
		c.allocateTimeout = d
		return positive("allocate timeout", d)
	}
}

// WithHandoverLocks turns hand-over locks on or off. Default on in clustering, and always
// off in broadcasting.
//
// With hand-over locks a queue moves to its new owner only after the previous owner has
// stopped handing out its messages, committed the offset past what Poll returned, and
// released the queue's lock on the broker (UNLOCK_BATCH_MQ). The new owner pulls only once it
// holds the lock (LOCK_BATCH_MQ), and reads the committed offset after taking it. So a message
// Poll returned before a rebalance is never returned again by another member: RocketMQ gives
// no such promise and asks consumers to be idempotent.
//
// A member that crashes loses its locks when its connection closes, or after the lease.
func WithHandoverLocks(on bool) Option {
	return func(c *config) error {
		c.handoverLocks, c.handoverLocksSet = on, true
		return nil
	}
}

// WithLockLease tells the consumer the broker's queue-lock lease (broker.Config.LockLease).
// The consumer stops handing out a queue's messages when it has not renewed its lock for half
// the lease, so that it never reads a queue whose lock may have passed to another member.
// Default 60 s, the broker's default.
func WithLockLease(d time.Duration) Option {
	return func(c *config) error {
		c.lockLease = d
		return positive("lock lease", d)
	}
}

// WithLockRenewInterval sets how often held queue locks are renewed. It must be below half
// the lease. Default: a third of the lease (20 s).
func WithLockRenewInterval(d time.Duration) Option {
	return func(c *config) error {
		c.lockRenew = d
		return positive("lock renew interval", d)
	}
}

// WithLockRetryInterval sets how often a queue whose lock another member still holds is tried
// again. Default 500 ms.
func WithLockRetryInterval(d time.Duration) Option {
	return func(c *config) error {
		c.lockRetry = d
		return positive("lock retry interval", d)
	}
}

// WithOffsetStoreDir sets the directory of the local offset file used in broadcasting:
// <dir>/<group>/offsets.json. Two broadcasting consumers of one group on one host need
// different directories. Default: $HOME/.flowd_offsets.
func WithOffsetStoreDir(dir string) Option {
	return func(c *config) error {
		c.offsetDir = dir
		return nil
	}
}

// WithQueueListener sets a function called with a topic's newly assigned queues every time a
// rebalance (or Assign) changes them. It runs on the rebalance goroutine, after the queues
// removed have been committed and released; it must not block for long, and must not call
// Close.
func WithQueueListener(fn func(topic string, queues []protocol.MessageQueue)) Option {
	return func(c *config) error {
		c.queueListener = fn
		return nil
	}
}

// WithOnQueuesRevoked sets a function called with the queues a rebalance takes away from this
// consumer (and, on Close, with every queue it reads), before their offsets are committed and
// their locks released: their messages are no longer handed out, and the new owner cannot
// have them yet. An application that commits by hand (WithAutoCommit(false)) commits what it
// processed of them here, with CommitOffsets, which accepts the queues being revoked until fn
// returns. Only queues the consumer had started reading are passed; queues whose lock was
// lost (another member may already read them) are not revoked but dropped without a commit.
//
// fn runs on the rebalance goroutine (on Close, on the caller's); it must not call Close or
// Poll, and the hand-over waits for it. ctx ends when the consumer is closed. Default none.
// It is franz-go's OnPartitionsRevoked.
func WithOnQueuesRevoked(fn func(ctx context.Context, queues []protocol.MessageQueue)) Option {
	return func(c *config) error {
		c.onRevoked = fn
		return nil
	}
}

// WithMaxReconsumeTimes sets how often a message may be sent back (SendBack) before the
// broker moves it to the group's dead-letter topic %DLQ%<group> instead of retrying it.
// Default: the broker's setting for the group (RocketMQ's default is 16).
func WithMaxReconsumeTimes(n int) Option {
	return func(c *config) error {
		c.maxReconsume = int32(n)
		return positive("max reconsume times", n)
	}
}

// WithMaxBodySize caps the size a compressed body may inflate to; a larger one fails the pull
// of its queue. Default 16 MiB.
func WithMaxBodySize(n int) Option {
	return func(c *config) error {
		c.maxBodySize = n
		return positive("max body size", n)
	}
}
