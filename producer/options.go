package producer

import (
	"compress/zlib"
	"fmt"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/protocol"
)

// Defaults of the producer's settings: RocketMQ's, except where a comment says otherwise.
const (
	// DefaultSendTimeout bounds a whole send, retries included (WithSendTimeout).
	DefaultSendTimeout = 3 * time.Second
	// DefaultRetries is how many times a failed send is tried again (WithRetries).
	DefaultRetries = 2
	// DefaultCompressOver is the body size above which bodies are compressed
	// (WithCompressOver).
	DefaultCompressOver = 4 << 10
	// DefaultCompressLevel is the zlib level of compressed bodies (WithCompressLevel).
	DefaultCompressLevel = protocol.DefaultCompressLevel
	// DefaultMaxMessageSize is the largest body, or encoded batch, accepted
	// (WithMaxMessageSize): the broker's default.
	DefaultMaxMessageSize = 4 << 20
	// DefaultDefaultTopicQueues is the queue count of a topic created by its first send
	// (WithDefaultTopicQueues).
	DefaultDefaultTopicQueues = 4
	// DefaultMaxInFlightAsync bounds the asynchronous sends outstanding, callbacks included
	// (WithMaxInFlightAsync).
	// RocketMQ's Java producer allows 10 000, which its broker queues; a flowd broker serves at
	// most 256 requests at once on one connection (broker.TransportConfig.MaxInFlightPerConn) and
	// answers SYSTEM_BUSY past that, so flowd's default stays well below, leaving room for the
	// other requests sharing the connection.
	DefaultMaxInFlightAsync = 128
)

// Option configures a Producer; pass options to New.
type Option func(*config) error

type config struct {
	client         *client.Client  // WithClient: shared, never closed by the producer
	clientOpts     []client.Option // WithClientOptions: of the client the producer builds
	sendTimeout    time.Duration
	retries        int
	compressOver   int
	compressLevel  int
	selector       QueueSelector
	maxMessageSize int
	defaultQueues  int
	createKey      string
	maxAsync       int
	txn            TransactionListener
	batchCount     int // WithAsyncBatching; <= 1: off
	batchBytes     int
	batchLinger    time.Duration
	batchInFlight  int // WithAsyncBatchesInFlight; 0: the default
}

func defaultConfig() config {
	return config{
		sendTimeout:    DefaultSendTimeout,
		retries:        DefaultRetries,
		compressOver:   DefaultCompressOver,
		compressLevel:  DefaultCompressLevel,
		selector:       RoundRobin(),
		maxMessageSize: DefaultMaxMessageSize,
		defaultQueues:  DefaultDefaultTopicQueues,
		createKey:      protocol.AutoCreateTopicKey,
		maxAsync:       DefaultMaxInFlightAsync,
	}
}

// WithClient makes the producer use cl, a client core it shares with other producers and
// consumers of the process, rather than build its own: they share one client id, one
// heartbeat and one connection per broker, and cl's settings (name servers, client id,
// logger, JSON headers, intervals). The producer registers its group into cl on Start and
// unregisters it on Close, but never closes cl: its creator does, after every producer and
// consumer using it. A group registers once per client, so two producers of one group need
// two clients.
//
// One of WithClient and WithClientOptions is required; they exclude each other.
func WithClient(cl *client.Client) Option {
	return func(c *config) error { c.client = cl; return nil }
}

// WithClientOptions makes the producer build a client core of its own from opts, and close
// it on Close: client.WithNameServers (required), client.WithLogger, client.WithInstanceName,
// client.WithClientIP (also written into message ids), client.WithJSONHeaders,
// client.WithHeartbeatInterval, client.WithRouteRefreshInterval, client.WithRequestTimeout,
// client.WithDialTimeout. Each is documented in package client, the one place the settings
// a producer and a consumer share are written; options given in several calls add up.
//
//	p, err := producer.New("orders", producer.WithClientOptions(
//		client.WithNameServers("127.0.0.1:9876"),
//		client.WithLogger(log),
//	))
//
// The client's id is then the producer's alone: its instance name defaults to a new unique
// one. One of WithClient and WithClientOptions is required; they exclude each other.
func WithClientOptions(opts ...client.Option) Option {
	return func(c *config) error { c.clientOpts = append(c.clientOpts, opts...); return nil }
}

// WithSendTimeout bounds a whole send, retries included, when the caller's context allows
// longer. It also bounds an asynchronous send once it is in flight (not its wait for a slot,
// see WithMaxInFlightAsync) and a oneway send.
//
// Default 3 s.
func WithSendTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("%w: send timeout must be positive", ErrInvalidOption)
		}
		c.sendTimeout = d
		return nil
	}
}

// WithRetries sets how many times a failed send is tried again, within the send timeout.
// Only failures that another attempt can fix are retried: connection errors and the broker
// codes SYSTEM_ERROR, SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, TOPIC_NOT_EXIST and NO_PERMISSION. A
// retry goes to another queue, on another broker when the topic has one, unless the selector
// keeps order (see OrderedSelector). Oneway sends are never retried.
//
// Default 2 (three attempts in all).
func WithRetries(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: retries must not be negative", ErrInvalidOption)
		}
		c.retries = n
		return nil
	}
}

// WithCompressOver sets the body size above which bodies are zlib-compressed (the message's
// sysFlag says so, and consumers inflate it). Batches are never compressed, as in RocketMQ.
// Default 4 KiB.
func WithCompressOver(bytes int) Option {
	return func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("%w: compress threshold must not be negative", ErrInvalidOption)
		}
		c.compressOver = bytes
		return nil
	}
}

// WithCompressLevel sets the zlib level of compressed bodies, zlib.BestSpeed (1) to
// zlib.BestCompression (9). Default 5, RocketMQ's.
func WithCompressLevel(level int) Option {
	return func(c *config) error {
		if level < zlib.HuffmanOnly || level > zlib.BestCompression {
			return fmt.Errorf("%w: compress level %d", ErrInvalidOption, level)
		}
		c.compressLevel = level
		return nil
	}
}

// WithQueueSelector sets how a queue is chosen for each message: RoundRobin, Random,
// HashByKey, or any QueueSelector. A selector that is an OrderedSelector whose Ordered
// reports true keeps every attempt of a send on the queue it chose first.
//
// Default RoundRobin().
func WithQueueSelector(s QueueSelector) Option {
	return func(c *config) error {
		if s == nil {
			return fmt.Errorf("%w: nil queue selector", ErrInvalidOption)
		}
		c.selector = s
		return nil
	}
}

// WithMaxMessageSize sets the largest body accepted (before compression), and the largest
// encoded batch. Larger messages are refused with ErrMessageTooLarge without a round trip.
// Default 4 MiB, the broker's default.
func WithMaxMessageSize(bytes int) Option {
	return func(c *config) error {
		if bytes <= 0 || bytes > protocol.MaxFrameSize {
			return fmt.Errorf("%w: max message size %d is outside 1..%d", ErrInvalidOption, bytes, protocol.MaxFrameSize)
		}
		c.maxMessageSize = bytes
		return nil
	}
}

// WithDefaultTopicQueues sets how many queues a topic created on first send gets. Default 4.
func WithDefaultTopicQueues(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("%w: default topic queues must be positive", ErrInvalidOption)
		}
		c.defaultQueues = n
		return nil
	}
}

// WithCreateTopicKey sets the topic whose route is used to send to a topic that does not
// exist yet; a broker that auto-creates topics creates it on the first send. Default
// "TBW102", RocketMQ's.
func WithCreateTopicKey(topic string) Option {
	return func(c *config) error {
		if topic == "" {
			return fmt.Errorf("%w: empty create-topic key", ErrInvalidOption)
		}
		c.createKey = topic
		return nil
	}
}

// WithMaxInFlightAsync bounds the asynchronous sends outstanding: admitted by SendAsync and
// whose callback has not returned yet, whether they wait for the broker's answer, gather in a
// batch (WithAsyncBatching), wait for their callback to run or are running it. Past n,
// SendAsync blocks until a callback returns, until its context ends, or until Close, like
// franz-go's MaxBufferedRecords (a record's slot is released once its promise returned). This
// bounds the goroutines and memory a burst of SendAsync calls can take, callbacks queued
// behind a slow one included, and keeps the requests in flight on the broker connection below
// the broker's limit (past which it answers SYSTEM_BUSY).
//
// What a callback may call: anything, this producer's Send and SendAsync included; a callback
// that blocks holds its slot meanwhile, and the producer runs callbacks on a few goroutines
// (see SendAsync), so a callback that blocks long holds up the others. A SendAsync that a
// callback makes when no slot is free does not wait: it takes over the slot of the send the
// callback reports on (which then counts as done), so a callback may always send on, as a
// chain of sends does, without deadlocking on the slot it holds itself. A callback that sends
// more than once may wait for the later sends like any caller; if every slot is held by a
// callback so waiting, or by a send whose callback waits behind them, nothing can free one:
// give such sends a context with a deadline. The same holds of a goroutine the callback
// starts and waits for: only the callback's own goroutine is recognised.
//
// Default DefaultMaxInFlightAsync (128).
func WithMaxInFlightAsync(n int) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("%w: max in-flight async sends must be positive, got %d", ErrInvalidOption, n)
		}
		c.maxAsync = n
		return nil
	}
}

// MaxAsyncBatchLinger is the longest linger WithAsyncBatching accepts.
const MaxAsyncBatchLinger = time.Millisecond

// WithAsyncBatching makes SendAsync gather messages bound for the same queue into one
// SEND_BATCH_MESSAGE of at most maxCount messages and about maxBytes bytes (at most the
// maximum message size). With a linger of 0, a queue's batch leaves at once when none of that
// queue is in flight, so a lone message is not delayed. Otherwise it gathers until the queue's
// batches in flight have all been answered, until linger (0 to MaxAsyncBatchLinger) has passed
// since its first message, or until it is half full, and then leaves as soon as fewer than
// WithAsyncBatchesInFlight of the queue are in flight. Each message still gets its own
// callback with its own MsgID, OffsetMsgID and QueueOffset; the callbacks of one batch run in
// the batch's order, one after another. A batch the broker refuses as a whole is sent again
// one message at a time, so each message gets its own answer.
//
// Off by default: a batch goes to the queue the selector chose for each of its messages (the
// same for all), but its messages are stored uncompressed (bodies over WithCompressOver and
// delayed messages are never batched and travel alone), a failed batch fails, or retries, all
// its messages together, and with several batches of a queue in flight their order can change
// when one is retried (see WithAsyncBatchesInFlight). maxCount of 1 turns batching off.
func WithAsyncBatching(maxCount, maxBytes int, linger time.Duration) Option {
	return func(c *config) error {
		if maxCount < 1 {
			return fmt.Errorf("%w: async batch count must be positive, got %d", ErrInvalidOption, maxCount)
		}
		if maxBytes <= 0 {
			return fmt.Errorf("%w: async batch bytes must be positive, got %d", ErrInvalidOption, maxBytes)
		}
		if linger < 0 || linger > MaxAsyncBatchLinger {
			return fmt.Errorf("%w: async batch linger must be within 0 and %s, got %s", ErrInvalidOption, MaxAsyncBatchLinger, linger)
		}
		c.batchCount, c.batchBytes, c.batchLinger = maxCount, maxBytes, linger
		return nil
	}
}

// DefaultAsyncBatchesInFlight is how many batches of one queue WithAsyncBatching keeps in
// flight by default (WithAsyncBatchesInFlight), unless the selector keeps order.
const DefaultAsyncBatchesInFlight = 4

// WithAsyncBatchesInFlight bounds the batches of one queue that WithAsyncBatching has in
// flight at once: handed to the broker connection and not yet finished, retries included
// (like Kafka's max.in.flight.requests.per.connection, but per queue). While that many are in
// flight, the queue's next messages gather into the next batch. One batch at a time makes
// each message wait for the batch before it to be answered; with more, a batch that is half
// full leaves while others are on their way, overlapping their round trips and the producer's
// and the broker's work.
//
// Order: a queue's batches are handed to the connection in the order their messages were
// given, and leave on it in that order. With n = 1 a batch leaves only once the one before it
// finished, so they are stored in that order whatever happens (retries included). With n > 1
// they are stored in that order when nothing fails and the broker serves one connection's
// sends one after another: a flowd broker in asynchronous-flush mode does, and so does a
// RocketMQ broker with its default single send thread. A batch that is retried, or resent
// message by message after the broker refused it, may be stored after later batches of its
// queue; and a broker that serves sends concurrently (flowd in SYNC_FLUSH mode, or while it
// starts a new commit-log segment) may store batches in flight together in either order.
//
// Default DefaultAsyncBatchesInFlight (4), or 1 when the selector is an OrderedSelector whose
// Ordered reports true (HashByKey): a selector chosen for order keeps it unless this option
// says otherwise. Messages in batches count against WithMaxInFlightAsync like any other, which
// bounds the memory they hold.
func WithAsyncBatchesInFlight(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: async batches in flight must be positive, got %d", ErrInvalidOption, n)
		}
		c.batchInFlight = n
		return nil
	}
}
