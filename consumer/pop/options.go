package pop

import (
	"fmt"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/protocol"
)

// Defaults of the consumer's settings.
const (
	// DefaultInvisibleDuration is how long a received message stays invisible
	// (RocketMQ's pop consumers' default).
	DefaultInvisibleDuration = 60 * time.Second
	// DefaultPollTime is how long a Receive waits for a message when none is there.
	DefaultPollTime = 5 * time.Second
	// MaxBatch is the most messages one Receive returns (the broker's bound).
	MaxBatch = 32
	// MinInvisibleDuration and MaxInvisibleDuration bound the invisible duration (the
	// broker's bounds).
	MinInvisibleDuration = time.Second
	MaxInvisibleDuration = 12 * time.Hour
)

type config struct {
	client     *client.Client
	clientOpts []client.Option
	invisible  time.Duration
	pollTime   time.Duration
	expType    string
	expression string
	order      bool
}

func defaultConfig() config {
	return config{invisible: DefaultInvisibleDuration, pollTime: DefaultPollTime, expType: protocol.ExpressionTag, expression: "*"}
}

// Option configures a Consumer.
type Option func(*config) error

// WithClient shares a client with producers and other consumers.
func WithClient(c *client.Client) Option {
	return func(cfg *config) error {
		if c == nil {
			return fmt.Errorf("%w: WithClient(nil)", ErrInvalidOption)
		}
		cfg.client = c
		return nil
	}
}

// WithClientOptions builds the consumer's own client from opts (client.WithNameServers is
// required); it is closed with the consumer. Not with WithClient.
func WithClientOptions(opts ...client.Option) Option {
	return func(cfg *config) error {
		cfg.clientOpts = append(cfg.clientOpts, opts...)
		return nil
	}
}

// WithInvisibleDuration sets how long a received message stays invisible to the group's
// other receives: MinInvisibleDuration to MaxInvisibleDuration, DefaultInvisibleDuration
// when not set.
func WithInvisibleDuration(d time.Duration) Option {
	return func(cfg *config) error {
		if d < MinInvisibleDuration || d > MaxInvisibleDuration {
			return fmt.Errorf("%w: invisible duration %v outside %v..%v", ErrInvalidOption, d, MinInvisibleDuration, MaxInvisibleDuration)
		}
		cfg.invisible = d
		return nil
	}
}

// WithPollTime sets how long a Receive waits at the broker when no message is there (0:
// answer at once); DefaultPollTime when not set. A Receive's context bounds it too.
func WithPollTime(d time.Duration) Option {
	return func(cfg *config) error {
		if d < 0 {
			return fmt.Errorf("%w: negative poll time %v", ErrInvalidOption, d)
		}
		cfg.pollTime = d
		return nil
	}
}

// WithFilter receives only the messages an expression selects: expType protocol.ExpressionTag
// ("TAG", expression "tagA || tagB", "*" for all, the default) or protocol.ExpressionSQL92.
func WithFilter(expType, expression string) Option {
	return func(cfg *config) error {
		if expType == "" {
			return fmt.Errorf("%w: empty expression type", ErrInvalidOption)
		}
		cfg.expType, cfg.expression = expType, expression
		return nil
	}
}

// WithOrder receives in order per message group: of the messages of one queue with the
// same message group (the __SHARDINGKEY property), the next is not received until the one
// before it is acknowledged; the messages of a queue without one are in order as a whole
// (RocketMQ's order flag of POP_MESSAGE).
func WithOrder() Option {
	return func(cfg *config) error {
		cfg.order = true
		return nil
	}
}
