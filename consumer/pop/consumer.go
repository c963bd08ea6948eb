package pop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// Message is a received message.
type Message struct {
	Topic      string
	BrokerName string
	QueueID    int32
	// QueueOffset is its position in the queue.
	QueueOffset int64
	// MsgID is the producer-assigned unique id (the UNIQ_KEY property), or the
	// broker-assigned one when the producer set none.
	MsgID string
	// Tags is the TAGS property; Keys the KEYS property, split on spaces.
	Tags string
	Keys []string
	// Body is the message body, decompressed if the producer compressed it.
	Body           []byte
	BornTimestamp  time.Time
	StoreTimestamp time.Time
	// Attempt is 1 on the first delivery, +1 per redelivery.
	Attempt int
	// Receipt names this delivery to the broker (RocketMQ's extra info, the POP_CK
	// property): Ack and ChangeInvisibleDuration send it back.
	Receipt string
	// InvisibleUntil is when the broker hands the message out again unless acknowledged.
	InvisibleUntil time.Time

	props string             // the property block as it came (key\x01value\x02…)
	rx    protocol.ExtraInfo // Receipt parsed, while rxOf == Receipt
	rxOf  string
}

// Properties decodes every property, POP_CK (the receipt) included, into a new map: a
// message holds its property block as it came, as most receivers read no property beyond
// Tags, Keys and MsgID.
func (m *Message) Properties() map[string]string {
	p, _ := protocol.DecodeProperties(m.props) // checked when the answer was decoded
	return p
}

// Property returns the named property, or "".
func (m *Message) Property(name string) string {
	v, _ := protocol.PropertyIn(m.props, name)
	return v
}

// receipt is m.Receipt parsed.
func (m *Message) receipt() (protocol.ExtraInfo, error) {
	if m.rxOf != "" && m.rxOf == m.Receipt {
		return m.rx, nil
	}
	x, err := protocol.ParseExtraInfo(m.Receipt)
	if err != nil {
		return x, fmt.Errorf("%w: message %s: %w", ErrInvalidArgument, m.MsgID, err)
	}
	if x.QueueOffset < 0 {
		x.QueueOffset = m.QueueOffset
	}
	return x, nil
}

// Consumer receives the messages of one topic for one consumer group by pop. It is safe for
// concurrent use.
type Consumer struct {
	group, topic string
	cfg          config
	cl           *clientcore.Client
	ownsClient   bool
	cursor       atomic.Uint32 // the broker the next Receive asks first
	closed       atomic.Bool
}

// New makes a consumer of topic for group; WithClient or WithClientOptions is required.
// Nothing is dialed until the first Receive.
func New(group, topic string, opts ...Option) (*Consumer, error) {
	if group == "" || topic == "" {
		return nil, fmt.Errorf("%w: group %q, topic %q: both are required", ErrInvalidArgument, group, topic)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	cl, owns, err := clientcore.Open(cfg.client, len(cfg.clientOpts), func() (*client.Client, error) {
		return client.New(cfg.clientOpts...)
	})
	if err != nil {
		return nil, fmt.Errorf("pop consumer %q: %w: %w", group, ErrInvalidOption, err)
	}
	if err := cl.Start(); err != nil { // route refreshes; idempotent on a shared client
		return nil, fmt.Errorf("pop consumer %q: %w", group, err)
	}
	return &Consumer{group: group, topic: topic, cfg: cfg, cl: cl, ownsClient: owns}, nil
}

// Group is the consumer group.
func (c *Consumer) Group() string { return c.group }

// Topic is the topic received from.
func (c *Consumer) Topic() string { return c.topic }

// Close closes the consumer's own client (not a shared one). Messages received and not
// acknowledged come back to the group once their invisibility passes.
func (c *Consumer) Close(ctx context.Context) error {
	if c.closed.Swap(true) || !c.ownsClient {
		return nil
	}
	if err := c.cl.Close(ctx); err != nil {
		return fmt.Errorf("close pop consumer %q: %w", c.group, err)
	}
	return nil
}

func (c *Consumer) check() error {
	if c.closed.Load() {
		return ErrClosed
	}
	return nil
}

// brokers lists the names of the brokers that have readable queues of the topic.
func (c *Consumer) brokers(ctx context.Context) ([]string, *clientcore.Route, error) {
	r, err := c.cl.Route(ctx, c.topic)
	if err != nil {
		return nil, nil, fmt.Errorf("pop %s: %w", c.topic, err)
	}
	var names []string
	for _, q := range r.SubscribeQueues {
		if _, ok := r.BrokerAddr(q.BrokerName); ok && !slices.Contains(names, q.BrokerName) {
			names = append(names, q.BrokerName)
		}
	}
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("pop %s: %w: no broker with a readable queue and a master", c.topic, clientcore.ErrBrokerNotFound)
	}
	return names, r, nil
}

// Receive pops up to n (1..MaxBatch) messages, from any queue of the topic's brokers, one
// broker per request. When none is there it waits up to the poll time (WithPollTime) for one,
// bounded by ctx; none then is no error: an empty slice.
func (c *Consumer) Receive(ctx context.Context, n int) ([]Message, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if n < 1 || n > MaxBatch {
		return nil, fmt.Errorf("%w: batch of %d outside 1..%d", ErrInvalidArgument, n, MaxBatch)
	}
	names, r, err := c.brokers(ctx)
	if err != nil {
		return nil, err
	}
	first := int(c.cursor.Add(1) % uint32(len(names)))
	// With several brokers each is asked without waiting, then the last one with the poll
	// time: a wait at one broker must not hold up messages at another. A broker that fails
	// does not end the receive while another may have messages: its error is returned only
	// if none had any.
	var errs []error
	for i := range len(names) - 1 {
		name := names[(first+i)%len(names)]
		addr, _ := r.BrokerAddr(name)
		msgs, err := c.popFrom(ctx, name, addr, n, 0)
		if len(msgs) > 0 {
			return msgs, nil
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	name := names[(first+len(names)-1)%len(names)]
	addr, _ := r.BrokerAddr(name)
	deadline := time.Now().Add(c.cfg.pollTime)
	// A broker that saw messages answers without waiting; another receive may have taken
	// them first, and then the answer is empty early: ask again, a few times, while the
	// poll time lasts.
	for tries := 0; ; tries++ {
		msgs, err := c.popFrom(ctx, name, addr, n, max(time.Until(deadline), 0))
		if len(msgs) > 0 {
			return msgs, nil
		}
		if err != nil || tries == 3 || time.Until(deadline) < 10*time.Millisecond || ctx.Err() != nil {
			if err != nil {
				errs = append(errs, err)
			}
			return nil, errors.Join(errs...)
		}
	}
}

// popFrom sends one POP_MESSAGE to the broker.
func (c *Consumer) popFrom(ctx context.Context, brokerName, addr string, n int, poll time.Duration) ([]Message, error) {
	if dl, ok := ctx.Deadline(); ok {
		// Answer before the caller's deadline: an empty answer, not a timeout.
		poll = min(poll, time.Until(dl)*3/4)
	}
	poll = max(poll, 0)
	h := protocol.PopMessageRequestHeader{
		ConsumerGroup: c.group, Topic: c.topic, QueueID: -1, MaxMsgNums: int32(n),
		InvisibleTime: c.cfg.invisible.Milliseconds(), PollTime: poll.Milliseconds(), BornTime: time.Now().UnixMilli(),
		InitMode: 1, ExpType: c.cfg.expType, Exp: c.cfg.expression, Order: c.cfg.order,
	}
	req := protocol.NewRequestWith(protocol.PopMessage, &h, nil)
	cctx, cancel := context.WithTimeout(ctx, poll+c.cl.RequestTimeout())
	defer cancel()
	resp, err := c.cl.Invoke(cctx, addr, req)
	if err != nil {
		if ctx.Err() != nil && poll > 0 && errors.Is(err, ctx.Err()) {
			return nil, nil // the caller ended the wait: nothing came
		}
		return nil, fmt.Errorf("pop %s from %s: %w", c.topic, addr, err)
	}
	switch resp.ResponseCode() {
	case protocol.Success:
	case protocol.PullNotFound, protocol.PollingTimeout, protocol.PollingFull:
		return nil, nil
	case protocol.TopicNotExist:
		return nil, fmt.Errorf("pop %s from %s: %w: %w", c.topic, addr, ErrTopicNotExist, clientcore.NewBrokerError(resp))
	default:
		return nil, fmt.Errorf("pop %s from %s: %w", c.topic, addr, clientcore.NewBrokerError(resp))
	}
	return decodeMessages(resp.Body, brokerName, c.topic)
}

// decodeMessages decodes a pop answer's body.
func decodeMessages(body []byte, brokerName, topic string) ([]Message, error) {
	out := make([]Message, 0, 32)
	var ext protocol.MessageExt
	var dec protocol.Decompressor
	for len(body) > 0 {
		n, err := protocol.DecodeStoredTo(&ext, body, protocol.DecodeOptions{RawProperties: true, Topic: topic})
		if err != nil {
			return out, fmt.Errorf("pop: decode the answer of %s: %w", brokerName, err)
		}
		body = body[n:]
		m := Message{
			Topic: ext.Topic, BrokerName: brokerName, QueueID: ext.QueueID, QueueOffset: ext.QueueOffset,
			Body: ext.Body, props: string(ext.RawProperties), BornTimestamp: time.UnixMilli(ext.BornTimestamp),
			StoreTimestamp: time.UnixMilli(ext.StoreTimestamp), Attempt: int(ext.ReconsumeTimes) + 1,
		}
		if ext.SysFlag&protocol.MsgFlagCompressed != 0 {
			if m.Body, err = dec.Decompress(nil, ext.Body, 0); err != nil {
				return out, fmt.Errorf("pop: message at %s/%d offset %d: %w", ext.Topic, ext.QueueID, ext.QueueOffset, err)
			}
		}
		var keys string
		// One pass over the block for the properties Message has as fields; a later pair of
		// a key wins, as in DecodeProperties.
		for rest := m.props; rest != ""; {
			pair := rest
			if i := strings.IndexByte(rest, protocol.PropertySeparator); i >= 0 {
				pair, rest = rest[:i], rest[i+1:]
			} else {
				rest = ""
			}
			k, v, ok := strings.Cut(pair, string(protocol.NameValueSeparator))
			if !ok {
				continue
			}
			switch k {
			case protocol.PropertyTags:
				m.Tags = v
			case protocol.PropertyKeys:
				keys = v
			case protocol.PropertyUniqueKey:
				m.MsgID = v
			case protocol.PropertyPopCK:
				m.Receipt = v
			}
		}
		if keys != "" {
			m.Keys = strings.Fields(keys)
		}
		if m.MsgID == "" {
			m.MsgID = protocol.OffsetMsgID(ext.StoreHost, ext.CommitLogOffset)
		}
		x, err := m.receipt()
		if err != nil {
			return out, fmt.Errorf("pop: message at %s/%d offset %d: %w", ext.Topic, ext.QueueID, ext.QueueOffset, err)
		}
		m.rx, m.rxOf = x, m.Receipt
		m.InvisibleUntil = time.UnixMilli(x.PopTime + x.InvisibleTime)
		out = append(out, m)
	}
	return out, nil
}

// Ack acknowledges messages for good: they are not received again. The messages of each
// broker go in one request (one ACK_MESSAGE, or one BATCH_ACK_MESSAGE for several). A
// message not in flight under its receipt makes the error wrap ErrNotInFlight; the others of
// its request are acknowledged.
func (c *Consumer) Ack(ctx context.Context, msgs ...Message) error {
	if err := c.check(); err != nil {
		return err
	}
	var order []string
	by := map[string][]*Message{}
	for i := range msgs {
		m := &msgs[i]
		if m.Receipt == "" || m.BrokerName == "" {
			return fmt.Errorf("%w: message %s has no receipt: not received by a pop consumer", ErrInvalidArgument, m.MsgID)
		}
		if _, ok := by[m.BrokerName]; !ok {
			order = append(order, m.BrokerName)
		}
		by[m.BrokerName] = append(by[m.BrokerName], m)
	}
	var errs []error
	for _, name := range order {
		if err := c.ackOn(ctx, name, by[name]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *Consumer) ackOn(ctx context.Context, brokerName string, msgs []*Message) error {
	addr, err := c.cl.FindBrokerAddr(ctx, brokerName, c.topic)
	if err != nil {
		return fmt.Errorf("ack on %s: %w", brokerName, err)
	}
	var req *protocol.Command
	if len(msgs) == 1 {
		m := msgs[0]
		req = protocol.NewRequestWith(protocol.AckMessage, &protocol.AckMessageRequestHeader{
			ConsumerGroup: c.group, Topic: c.topic, QueueID: m.QueueID, ExtraInfo: m.Receipt, Offset: m.QueueOffset}, nil)
	} else {
		body, err := c.batchBody(brokerName, msgs)
		if err != nil {
			return err
		}
		req = protocol.NewRequest(protocol.BatchAckMessage, nil, body)
	}
	resp, err := c.cl.Invoke(ctx, addr, req)
	if err != nil {
		return fmt.Errorf("ack %d messages on %s: %w", len(msgs), addr, err)
	}
	return answerError(resp, fmt.Sprintf("ack %d messages on %s", len(msgs), addr))
}

// batchBody merges receipts as RocketMQ's clients do: one entry per queue, checkpoint offset
// and pop time, the offsets a bit set from the checkpoint offset.
func (c *Consumer) batchBody(brokerName string, msgs []*Message) ([]byte, error) {
	type key struct {
		retry   string
		queue   int32
		ck, pop int64
	}
	idx := map[key]int{}
	body := protocol.BatchAckMessageRequestBody{BrokerName: brokerName}
	for _, m := range msgs {
		x, err := m.receipt()
		if err != nil {
			return nil, err
		}
		k := key{x.Retry, x.QueueID, x.CkQueueOffset, x.PopTime}
		i, ok := idx[k]
		if !ok {
			i = len(body.Acks)
			idx[k] = i
			body.Acks = append(body.Acks, protocol.BatchAck{ConsumerGroup: c.group, Topic: c.topic, Retry: x.Retry, StartOffset: x.CkQueueOffset,
				QueueID: x.QueueID, ReviveQueueID: x.ReviveQid, PopTime: x.PopTime, InvisibleTime: x.InvisibleTime})
		}
		body.Acks[i].Set(x.QueueOffset)
	}
	return json.Marshal(body)
}

// answerError is nil for SUCCESS, else the broker's refusal (wrapping ErrNotInFlight for
// NO_MESSAGE, ErrTopicNotExist for TOPIC_NOT_EXIST).
func answerError(resp *protocol.Command, what string) error {
	switch resp.ResponseCode() {
	case protocol.Success:
		return nil
	case protocol.NoMessage:
		return fmt.Errorf("%s: %w: %w", what, ErrNotInFlight, clientcore.NewBrokerError(resp))
	case protocol.TopicNotExist:
		return fmt.Errorf("%s: %w: %w", what, ErrTopicNotExist, clientcore.NewBrokerError(resp))
	}
	return fmt.Errorf("%s: %w", what, clientcore.NewBrokerError(resp))
}

// ChangeInvisibleDuration makes a received message invisible for d from now (0 up to
// MaxInvisibleDuration; 0 makes it visible again at once) and returns it with its new
// receipt and InvisibleUntil: the old receipt stops working.
func (c *Consumer) ChangeInvisibleDuration(ctx context.Context, m Message, d time.Duration) (Message, error) {
	if err := c.check(); err != nil {
		return m, err
	}
	if d < 0 || d > MaxInvisibleDuration {
		return m, fmt.Errorf("%w: invisible duration %v outside 0..%v", ErrInvalidArgument, d, MaxInvisibleDuration)
	}
	x, err := m.receipt()
	if err != nil {
		return m, err
	}
	addr, err := c.cl.FindBrokerAddr(ctx, m.BrokerName, c.topic)
	if err != nil {
		return m, fmt.Errorf("change invisible duration on %s: %w", m.BrokerName, err)
	}
	req := protocol.NewRequestWith(protocol.ChangeMessageInvisibleTime, &protocol.ChangeInvisibleTimeRequestHeader{
		ConsumerGroup: c.group, Topic: c.topic, QueueID: m.QueueID, ExtraInfo: m.Receipt, Offset: m.QueueOffset, InvisibleTime: d.Milliseconds()}, nil)
	resp, err := c.cl.Invoke(ctx, addr, req)
	if err != nil {
		return m, fmt.Errorf("change invisible duration on %s: %w", addr, err)
	}
	if err := answerError(resp, "change invisible duration on "+addr); err != nil {
		return m, err
	}
	var rh protocol.ChangeInvisibleTimeResponseHeader
	if err := resp.DecodeHeader(&rh); err != nil {
		return m, fmt.Errorf("change invisible duration on %s: %w", addr, err)
	}
	x.PopTime, x.InvisibleTime, x.ReviveQid = rh.PopTime, rh.InvisibleTime, rh.ReviveQid
	m.Receipt = x.String()
	m.rx, m.rxOf = x, m.Receipt
	m.props = string(protocol.AppendSetProperty(nil, m.props, protocol.PropertyPopCK, m.Receipt))
	m.InvisibleUntil = time.UnixMilli(x.PopTime + x.InvisibleTime)
	return m, nil
}
