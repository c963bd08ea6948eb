package producer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// Producer sends messages to flowd (or any RocketMQ broker). Create it with New, Start it,
// and Close it when done. All methods are safe for concurrent use.
//
// # Lock order
//
// mu (a read-write lock) guards the lifecycle: sends hold it for reading while they check
// the state and register an asynchronous send, Start and Close hold it for writing. No other
// lock is taken under it, and it is never held while waiting (for a slot, or the network).
// The batcher's lock (WithAsyncBatching) and the callback queue's are each taken alone, never
// under another, and held only to change their state: encoding and queueing a batch happen
// outside them.
type Producer struct {
	group      string
	cfg        config
	log        *slog.Logger
	cl         *clientcore.Client
	ownsClient bool
	uniq       *uniqGen
	comp       sync.Pool     // *protocol.Compressor
	asyncSlots chan struct{} // one token per asynchronous send in flight
	closing    chan struct{} // closed by Close: wakes SendAsync calls waiting for a slot
	batcher    *asyncBatcher // nil unless WithAsyncBatching
	callbacks  callbacks     // runs the callbacks of SendAsync calls, batched or not
	sends      sync.Pool     // *asyncSend of unbatched SendAsync calls that ended, for reuse

	mu    sync.RWMutex
	state int // stateNew, stateRunning, stateClosed
	async sync.WaitGroup

	// Transaction check-backs (WithTransactionListener): checks counts those running, at
	// most cap(checkSlots); checkCtx ends at Close.
	checks      sync.WaitGroup
	checkSlots  chan struct{}
	checkCtx    context.Context
	checkCancel context.CancelFunc
}

const (
	stateNew = iota
	stateRunning
	stateClosed
)

// New returns a producer of group; it sends nothing until Start.
func New(group string, opts ...Option) (*Producer, error) {
	if group == "" {
		return nil, fmt.Errorf("%w: empty producer group", ErrInvalidOption)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	p := &Producer{
		group:      group,
		cfg:        cfg,
		asyncSlots: make(chan struct{}, cfg.maxAsync),
		closing:    make(chan struct{}),
		checkSlots: make(chan struct{}, maxConcurrentChecks),
	}
	p.checkCtx, p.checkCancel = context.WithCancel(context.Background())
	p.callbacks.cond.L = &p.callbacks.mu
	if cfg.batchCount > 1 {
		p.batcher = newAsyncBatcher(&cfg)
	}
	var err error
	p.cl, p.ownsClient, err = clientcore.Open(cfg.client, len(cfg.clientOpts), func() (*client.Client, error) {
		return client.New(cfg.clientOpts...)
	})
	if err != nil {
		return nil, fmt.Errorf("producer %q: %w: %w", group, ErrInvalidOption, err)
	}
	p.log = p.cl.Logger().With("producerGroup", group)
	ip, _, _ := strings.Cut(p.cl.ID(), "@")
	p.uniq = newUniqGen(ip)
	level := cfg.compressLevel
	p.comp.New = func() any {
		c, err := protocol.NewCompressor(level)
		if err != nil {
			return nil // the level was validated; cannot happen
		}
		return c
	}
	return p, nil
}

// Group is the producer group.
func (p *Producer) Group() string { return p.group }

// ClientID is the id brokers know this producer by, "ip@instance".
func (p *Producer) ClientID() string { return p.cl.ID() }

// Start registers the producer in its group. Nothing is dialed until the first send, so
// Start does not wait on the network. A ctx that is already done fails Start with its error
// and leaves the producer as it was, so Start may be called again.
func (p *Producer) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start producer %q: %w", p.group, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != stateNew {
		return fmt.Errorf("start producer %q: %w", p.group, ErrBadState)
	}
	if err := p.cl.Start(); err != nil { // a shared client may already run: Start is idempotent
		return fmt.Errorf("start producer %q: %w", p.group, err)
	}
	if err := p.cl.RegisterProducer(p.group); err != nil {
		return fmt.Errorf("start producer %q: %w", p.group, err)
	}
	if p.cfg.txn != nil {
		p.cl.SetTransactionChecker(p.group, txnChecker{p})
	}
	p.state = stateRunning
	return nil
}

// Close refuses new sends (SendAsync calls waiting for a slot get ErrClosed), waits for the
// asynchronous sends in flight, leaves the producer group on every broker, and closes the
// producer's own client core.
//
// ctx bounds the wait and the unregistration. When it ends first, Close goes on and reports
// it; closing the client core then fails the sends still in flight, whose callbacks may run
// after Close returned (with a shared client core they run to their own end).
func (p *Producer) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.state == stateClosed {
		p.mu.Unlock()
		return nil
	}
	wasRunning := p.state == stateRunning
	p.state = stateClosed
	close(p.closing)
	p.mu.Unlock()

	var errs []error
	done := make(chan struct{})
	go func() {
		p.async.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("asynchronous sends still in flight: %w", ctx.Err()))
	}
	p.callbacks.stop()
	if err := p.stopChecks(ctx); err != nil {
		errs = append(errs, err)
	}
	if wasRunning {
		if err := p.cl.UnregisterProducer(ctx, p.group); err != nil {
			errs = append(errs, err)
		}
	}
	if p.ownsClient {
		errs = append(errs, p.cl.Close(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close producer %q: %w", p.group, err)
	}
	return nil
}

func (p *Producer) stateErr() error {
	switch p.state {
	case stateNew:
		return ErrNotStarted
	case stateClosed:
		return ErrClosed
	}
	return nil
}

func (p *Producer) checkRunning() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.stateErr()
}

// prepared is a message ready for the wire.
type prepared struct {
	msg     *Message
	uniq    string
	props   string // the properties sent, encoded: the message's and the well-known ones
	body    []byte
	sysFlag int32
	batch   bool
	reply   bool // sent with SEND_REPLY_MESSAGE_V2 (Reply)
}

// prepare validates msg and encodes its properties, compressing the body when it is large
// and compress is set. extra are more properties, key and value in turn, that take
// precedence over the message's own.
func (p *Producer) prepare(msg *Message, compress bool, extra ...string) (*prepared, error) {
	pm := new(prepared)
	if err := p.prepareTo(pm, msg, compress, extra...); err != nil {
		return nil, err
	}
	return pm, nil
}

// prepareTo is prepare into pm, which the caller may keep by value: a batched SendAsync keeps
// it in its batch, with no allocation of its own.
func (p *Producer) prepareTo(pm *prepared, msg *Message, compress bool, extra ...string) error {
	if msg == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if msg.Topic == "" || len(msg.Topic) > protocol.MaxTopicLength {
		return fmt.Errorf("%w: topic %q must have 1 to %d bytes", ErrInvalidMessage, msg.Topic, protocol.MaxTopicLength)
	}
	if len(msg.Body) == 0 {
		return fmt.Errorf("%w: empty body (topic %q)", ErrInvalidMessage, msg.Topic)
	}
	if len(msg.Body) > p.cfg.maxMessageSize {
		return fmt.Errorf("%w: body of %d bytes exceeds %d (topic %q)", ErrMessageTooLarge, len(msg.Body), p.cfg.maxMessageSize, msg.Topic)
	}
	var id [uniqLen]byte
	p.uniq.fill(&id)
	*pm = prepared{msg: msg, body: msg.Body}
	var at int
	pm.props, at = encodeProperties(msg, id[:], extra)
	pm.uniq = pm.props[at : at+uniqLen] // the id is in the properties: no string of its own
	if len(pm.props) > protocol.MaxPropertiesLength {
		return fmt.Errorf("%w: properties of %d bytes exceed %d (topic %q)", ErrInvalidMessage, len(pm.props), protocol.MaxPropertiesLength, msg.Topic)
	}
	if compress && len(msg.Body) > p.cfg.compressOver {
		if c, _ := p.comp.Get().(*protocol.Compressor); c != nil {
			out, err := c.Compress(nil, msg.Body)
			p.comp.Put(c)
			if err == nil && len(out) < len(msg.Body) {
				pm.body, pm.sysFlag = out, protocol.MsgFlagCompressed
			}
		}
	}
	return nil
}

// encodeProperties encodes the properties a message is sent with, in the key\x01value\x02
// form, straight into one string: the message's own (sorted by key, for a stable encoding),
// then the well-known ones its fields set, which take precedence, then extra (key and value
// in turn), which take precedence over both. No map is built: this runs once per message.
func encodeProperties(msg *Message, uniq []byte, extra []string) (props string, uniqAt int) {
	var keys string
	if len(msg.Keys) > 0 {
		keys = strings.Join(msg.Keys, " ")
	}
	var delay string
	if msg.DelayLevel > 0 {
		delay = strconv.Itoa(msg.DelayLevel)
	}
	// set reports whether a well-known or extra property replaces the message's own key k.
	set := func(k string) bool {
		switch k {
		case protocol.PropertyUniqueKey, protocol.PropertyWaitStoreOK:
			return true
		case protocol.PropertyTags:
			return msg.Tags != ""
		case protocol.PropertyKeys:
			return keys != ""
		case protocol.PropertyDelayLevel:
			return delay != ""
		}
		for i := 0; i+1 < len(extra); i += 2 {
			if extra[i] == k {
				return true
			}
		}
		return false
	}
	n := len(protocol.PropertyUniqueKey) + len(uniq) + len(protocol.PropertyWaitStoreOK) + 4 + 4 +
		len(protocol.PropertyTags) + len(msg.Tags) + 2 + len(protocol.PropertyKeys) + len(keys) + 2 +
		len(protocol.PropertyDelayLevel) + len(delay) + 2
	for k, v := range msg.Properties {
		n += len(k) + len(v) + 2
	}
	for _, e := range extra {
		n += len(e) + 1
	}
	var b strings.Builder // its String does not copy: one allocation for the whole encoding
	b.Grow(n)
	add := func(k, v string) {
		b.WriteString(k)
		b.WriteByte(protocol.NameValueSeparator)
		b.WriteString(v)
		b.WriteByte(protocol.PropertySeparator)
	}
	if len(msg.Properties) > 0 {
		var stack [16]string
		own := stack[:0]
		for k := range msg.Properties {
			if !set(k) {
				own = append(own, k)
			}
		}
		slices.Sort(own)
		for _, k := range own {
			add(k, msg.Properties[k])
		}
	}
	if msg.Tags != "" {
		add(protocol.PropertyTags, msg.Tags)
	}
	if keys != "" {
		add(protocol.PropertyKeys, keys)
	}
	if delay != "" {
		add(protocol.PropertyDelayLevel, delay)
	}
	b.WriteString(protocol.PropertyUniqueKey)
	b.WriteByte(protocol.NameValueSeparator)
	uniqAt = b.Len()
	b.Write(uniq)
	b.WriteByte(protocol.PropertySeparator)
	add(protocol.PropertyWaitStoreOK, "true")
	for i := 0; i+1 < len(extra); i += 2 {
		add(extra[i], extra[i+1])
	}
	return b.String(), uniqAt
}

// Send sends msg and waits for the broker to store it, retrying retriable failures on another
// queue (see WithRetries). The send is bounded by ctx and by the send timeout.
//
// A message the broker stored without flushing or replicating it in time (a sync-flush
// broker's slow disk) is reported with a nil error and a Status other than SendOK, with its
// ids and offset, and is not sent again: only failures after which nothing was stored are
// retried, so one Send stores at most one copy of a message that the broker acknowledged.
func (p *Producer) Send(ctx context.Context, msg *Message) (SendResult, error) {
	if err := p.checkRunning(); err != nil {
		return SendResult{}, err
	}
	pm, err := p.prepare(msg, true)
	if err != nil {
		return SendResult{}, err
	}
	return p.send(ctx, pm)
}

// SendAsync sends msg in the background and calls done with the outcome; done may be nil. At
// most WithMaxInFlightAsync sends are outstanding at once, from SendAsync until done returned:
// past that, SendAsync blocks until a callback returns, until ctx ends (done gets ctx's error,
// and nothing is sent) or until Close (done gets ErrClosed). Close waits for the sends in
// flight and their callbacks.
//
// An error found before sending (not started, closed, invalid message, no slot) is passed to
// done before SendAsync returns, on the caller's goroutine. Otherwise done runs on one of a
// few goroutines the producer keeps for callbacks, in the order the sends completed,
// callbacks of different sends possibly at the same time (no order between them is promised);
// with WithAsyncBatching, the callbacks of one batch run in the batch's order, one after
// another. done may call SendAsync itself: when no slot is free, the first such call takes
// over the slot of the send done reports on rather than wait for it (see WithMaxInFlightAsync
// for what else a callback may do).
//
// No goroutine waits for a send, batched or not: its request is queued on the broker
// connection, whose writer sends the requests queued meanwhile together, and the answer is
// read by the connection's reader, which queues the callback. A send (or a batch) that must be
// retried gets a goroutine for its further attempts, and so does the first send to a topic
// whose route is not known yet. SendAsync may wait for the connection to the broker to be
// dialed, on its first use; with WithAsyncBatching it may also encode and queue batches of its
// message's queue that are ready to leave.
func (p *Producer) SendAsync(ctx context.Context, msg *Message, done func(SendResult, error)) {
	if done == nil {
		done = func(SendResult, error) {}
	}
	if err := p.checkRunning(); err != nil {
		done(SendResult{}, err)
		return
	}
	var pmv prepared // kept by value in its batch when batched: moved to the heap only otherwise
	if err := p.prepareTo(&pmv, msg, true); err != nil {
		done(SendResult{}, err)
		return
	}
	if err := ctx.Err(); err != nil { // a free slot must not win over an ended context
		done(SendResult{}, fmt.Errorf("send to topic %q: %w", msg.Topic, err))
		return
	}
	if err := p.takeSlot(ctx, msg.Topic); err != nil {
		done(SendResult{}, err)
		return
	}
	// Register under the lock that Close takes to change the state, so that Close either sees
	// this send in the wait group or this send sees Close.
	p.mu.RLock()
	if err := p.stateErr(); err != nil {
		p.mu.RUnlock()
		<-p.asyncSlots // a slot taken over from a callback is this send's too
		done(SendResult{}, err)
		return
	}
	p.async.Add(1)
	p.mu.RUnlock()
	if p.batchable(msg) {
		p.enqueueAsync(ctx, pmv, done)
		return
	}
	if p.sendAsyncDirect(ctx, &pmv, done) {
		return
	}
	pm := new(prepared)
	*pm = pmv
	go func() {
		res, err := p.send(ctx, pm)
		p.completeAsync(done, res, err)
	}()
}

// takeSlot admits one asynchronous send under the WithMaxInFlightAsync bound: it takes a free
// slot, or one a callback calling it holds (callbacks.lend), or waits for a slot until ctx ends
// or Close.
func (p *Producer) takeSlot(ctx context.Context, topic string) error {
	select {
	case p.asyncSlots <- struct{}{}:
		return nil
	default:
	}
	if p.callbacks.lend() {
		return nil
	}
	select {
	case p.asyncSlots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("send to topic %q: waiting for one of %d async sends in flight and their callbacks: %w", topic, cap(p.asyncSlots), ctx.Err())
	case <-p.closing:
		return fmt.Errorf("send to topic %q: %w", topic, ErrClosed)
	}
}

// SendOneway sends msg without waiting for the broker: it returns once the request is
// written. Nothing tells whether the message was stored, and failures are not retried.
func (p *Producer) SendOneway(ctx context.Context, msg *Message) error {
	if err := p.checkRunning(); err != nil {
		return err
	}
	pm, err := p.prepare(msg, true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	queues, err := p.publishQueues(ctx, msg.Topic)
	if err != nil {
		return err
	}
	mq := p.cfg.selector.Select(msg, queues)
	addr, req, err := p.request(ctx, mq, pm)
	if err != nil {
		return err
	}
	if err := p.cl.InvokeOneway(ctx, addr, req); err != nil {
		return fmt.Errorf("send oneway to %s: %w", mq, err)
	}
	return nil
}

// SendBatch sends msgs, which must share one topic and not be delayed, as one
// SEND_BATCH_MESSAGE: they are stored together, in order, in one queue (chosen by the
// selector for the first message), at consecutive offsets. The encoded batch must fit the
// maximum message size.
//
// It returns one SendResult per message, in the order of msgs: each with the message's own
// MsgID, OffsetMsgID and QueueOffset, and the Status and Queue of the whole batch. Either
// every message is stored or none is.
func (p *Producer) SendBatch(ctx context.Context, msgs ...*Message) ([]SendResult, error) {
	if err := p.checkRunning(); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: empty batch", ErrInvalidMessage)
	}
	topic := ""
	pms := make([]*prepared, len(msgs))
	uniqs := make([]string, len(msgs))
	for i, m := range msgs {
		pm, err := p.prepare(m, false)
		if err != nil {
			return nil, fmt.Errorf("batch message %d: %w", i, err)
		}
		if i == 0 {
			topic = m.Topic
		}
		if m.Topic != topic {
			return nil, fmt.Errorf("%w: batch mixes topics %q and %q", ErrInvalidMessage, topic, m.Topic)
		}
		if m.DelayLevel > 0 {
			return nil, fmt.Errorf("%w: batch message %d is delayed; delayed messages cannot be batched", ErrInvalidMessage, i)
		}
		pms[i] = pm
		uniqs[i] = pm.uniq
	}
	body, err := encodeBatch(pms)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMessageTooLarge, err)
	}
	if len(body) > p.cfg.maxMessageSize {
		return nil, fmt.Errorf("%w: batch of %d bytes exceeds %d", ErrMessageTooLarge, len(body), p.cfg.maxMessageSize)
	}
	pm := &prepared{msg: msgs[0], uniq: strings.Join(uniqs, ","), body: body, batch: true}
	res, err := p.send(ctx, pm)
	if err != nil {
		return nil, err
	}
	return splitBatchResult(res, uniqs), nil
}

// splitBatchResult turns the one answer to a batch into a result per message. The broker
// answers with the first message's queue offset and the messages' offset ids joined with
// commas (RocketMQ's form); a broker that sends some other number of ids leaves OffsetMsgID
// empty rather than guessing which is whose.
func splitBatchResult(res SendResult, uniqs []string) []SendResult {
	offIDs := strings.Split(res.OffsetMsgID, ",")
	out := make([]SendResult, len(uniqs))
	for i, u := range uniqs {
		out[i] = SendResult{Status: res.Status, MsgID: u, Queue: res.Queue, QueueOffset: res.QueueOffset + int64(i), TransactionID: res.TransactionID}
		if len(offIDs) == len(uniqs) {
			out[i].OffsetMsgID = offIDs[i]
		}
	}
	return out
}

// send sends pm with retries within the send timeout.
func (p *Producer) send(ctx context.Context, pm *prepared) (SendResult, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.sendTimeout)
	defer cancel()
	queues, err := p.publishQueues(ctx, pm.msg.Topic)
	if err != nil {
		return SendResult{}, err
	}
	return p.sendAttempts(ctx, pm, queues, 0, MessageQueue{}, nil)
}

// sendAttempts makes pm's attempts from the from-th on (0: all of them), within ctx. When
// from > 0, the earlier attempts were made, the first of them to first, and the last failed
// with lastErr.
func (p *Producer) sendAttempts(ctx context.Context, pm *prepared, queues []MessageQueue, from int, first MessageQueue, lastErr error) (SendResult, error) {
	os, ok := p.cfg.selector.(OrderedSelector)
	ordered := ok && os.Ordered()
	var failed *MessageQueue
	if from > 0 {
		failed = &first
	}
	attempts := from
	for attempt := from; attempt <= p.cfg.retries; attempt++ {
		attempts++
		var mq MessageQueue
		switch {
		case attempt == 0:
			mq = p.cfg.selector.Select(pm.msg, queues)
			first = mq
		case ordered:
			mq = first
		default:
			mq = p.cfg.selector.Select(pm.msg, avoid(queues, *failed))
		}
		res, stored, err := p.sendTo(ctx, mq, pm)
		if err == nil {
			return res, nil
		}
		lastErr = err
		if stored || !retriable(err) || ctx.Err() != nil {
			break // a stored message is never sent again: that would store a second copy
		}
		p.log.Debug("send failed, retrying", "queue", mq.String(), "attempt", attempt+1, "err", err)
		failed = &mq
	}
	return SendResult{}, fmt.Errorf("send to topic %q (%d attempts): %w", pm.msg.Topic, attempts, lastErr)
}

// avoid returns the queues a retry may use after failed failed: those on other brokers when
// there are any, else every queue but failed, else all.
func avoid(queues []MessageQueue, failed MessageQueue) []MessageQueue {
	other := slices.DeleteFunc(slices.Clone(queues), func(q MessageQueue) bool { return q.BrokerName == failed.BrokerName })
	if len(other) > 0 {
		return other
	}
	other = slices.DeleteFunc(slices.Clone(queues), func(q MessageQueue) bool { return q == failed })
	if len(other) > 0 {
		return other
	}
	return queues
}

// retriable reports whether another attempt may succeed where err failed: not when the
// caller gave up, nor when the client core was closed under the send.
func retriable(err error) bool {
	if errors.Is(err, remoting.ErrClientClosed) || errors.Is(err, clientcore.ErrClosed) {
		return false
	}
	var be *BrokerError
	if errors.As(err, &be) {
		switch be.Code {
		case protocol.SystemError, protocol.SystemBusy, protocol.ServiceNotAvailable, protocol.TopicNotExist, protocol.NoPermission:
			return true
		}
		return false
	}
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// publishQueues returns topic's writable queues, or, when the topic has no route yet, queues
// derived from the auto-create key's route: the broker creates the topic on the first send.
func (p *Producer) publishQueues(ctx context.Context, topic string) ([]MessageQueue, error) {
	r, err := p.cl.Route(ctx, topic)
	if err == nil && len(r.PublishQueues) > 0 {
		return r.PublishQueues, nil
	}
	if err != nil && !errors.Is(err, clientcore.ErrTopicNotExist) {
		return nil, fmt.Errorf("%w %q: %w", ErrNoRoute, topic, err)
	}
	def, derr := p.cl.Route(ctx, p.cfg.createKey)
	if derr != nil {
		return nil, fmt.Errorf("%w %q: the topic has no route, nor has the auto-create key %q: %w", ErrNoRoute, topic, p.cfg.createKey, derr)
	}
	var queues []MessageQueue
	for _, qd := range def.Data.QueueDatas {
		if _, ok := def.BrokerAddr(qd.BrokerName); !ok || qd.Perm&protocol.PermWrite == 0 {
			continue
		}
		n := min(p.cfg.defaultQueues, int(qd.WriteQueueNums))
		for i := range n {
			queues = append(queues, MessageQueue{Topic: topic, BrokerName: qd.BrokerName, QueueID: i})
		}
	}
	if len(queues) == 0 {
		return nil, fmt.Errorf("%w %q: the auto-create key %q has no writable queue", ErrNoRoute, topic, p.cfg.createKey)
	}
	slices.SortFunc(queues, MessageQueue.Compare)
	return queues, nil
}

// request builds the send request of pm to mq.
func (p *Producer) request(ctx context.Context, mq MessageQueue, pm *prepared) (string, *protocol.Command, error) {
	addr, err := p.cl.FindBrokerAddr(ctx, mq.BrokerName, mq.Topic)
	if err != nil {
		return "", nil, fmt.Errorf("%w %q: %w", ErrNoRoute, mq.Topic, err)
	}
	return addr, p.newSendRequest(mq, pm), nil
}

// newSendRequest builds the send request of pm to mq.
func (p *Producer) newSendRequest(mq MessageQueue, pm *prepared) *protocol.Command {
	req := &sendRequest{}
	req.init(p.sendHeader(mq, pm, time.Now()))
	req.cmd.Body = pm.body
	return &req.cmd
}

// sendHeader is the request code and header of pm's send to mq, born at now.
func (p *Producer) sendHeader(mq MessageQueue, pm *prepared, now time.Time) (protocol.RequestCode, protocol.SendMessageRequestHeader) {
	h := protocol.SendMessageRequestHeader{
		ProducerGroup:         p.group,
		Topic:                 mq.Topic,
		DefaultTopic:          p.cfg.createKey,
		DefaultTopicQueueNums: int32(p.cfg.defaultQueues),
		QueueID:               int32(mq.QueueID),
		SysFlag:               pm.sysFlag,
		BornTimestamp:         now.UnixMilli(),
		Flag:                  pm.msg.Flag,
		Properties:            pm.props,
		MaxReconsumeTimes:     -1,
		Batch:                 pm.batch,
		BrokerName:            mq.BrokerName,
	}
	code := protocol.SendMessageV2
	if pm.batch {
		code, h.Properties, h.Flag = protocol.SendBatchMessage, "", 0
	}
	if pm.reply {
		code = protocol.SendReplyMessageV2
	}
	return code, h
}

// sendTo sends pm to mq once. stored reports that the broker said it stored the message
// (SUCCESS or one of the codes of a stored but not yet safe message), even when its answer
// could not be read: such a send must not be retried.
func (p *Producer) sendTo(ctx context.Context, mq MessageQueue, pm *prepared) (res SendResult, stored bool, err error) {
	addr, req, err := p.request(ctx, mq, pm)
	if err != nil {
		return SendResult{}, false, err
	}
	resp, err := p.cl.Invoke(ctx, addr, req)
	if err != nil {
		return SendResult{}, false, fmt.Errorf("send to %s at %s: %w", mq, addr, err)
	}
	return sendResult(mq, addr, pm, resp)
}

// sendResult reads the broker's answer to pm's send to mq at addr; stored is as for sendTo.
func sendResult(mq MessageQueue, addr string, pm *prepared, resp *protocol.Command) (res SendResult, stored bool, err error) {
	res = SendResult{Status: SendOK, MsgID: pm.uniq}
	switch resp.ResponseCode() {
	case protocol.Success:
	case protocol.FlushDiskTimeout:
		res.Status = SendFlushDiskTimeout
	case protocol.FlushSlaveTimeout:
		res.Status = SendFlushSlaveTimeout
	case protocol.SlaveNotAvailable:
		res.Status = SendSlaveNotAvailable
	default:
		return SendResult{}, false, fmt.Errorf("send to %s at %s: %w", mq, addr, clientcore.NewBrokerError(resp))
	}
	var rh protocol.SendMessageResponseHeader
	// From the map or, for an answer read raw (InvokeAsyncRaw), from its bytes.
	if err := protocol.DecodeSendResponse(resp, &rh); err != nil {
		return SendResult{}, true, fmt.Errorf("send to %s: stored (%s), but the answer is unreadable: %w", mq, res.Status, err)
	}
	res.OffsetMsgID = rh.MsgID
	res.Queue = MessageQueue{Topic: mq.Topic, BrokerName: mq.BrokerName, QueueID: int(rh.QueueID)}
	res.QueueOffset = rh.QueueOffset
	res.TransactionID = rh.TransactionID
	return res, true, nil
}

// sendRequest is a send request's command and its typed header in one allocation; the
// command writes the header straight into its frame through Fields: no map per send.
type sendRequest struct {
	cmd protocol.Command
	h   protocol.SendV2Fields
}

// init sets r to a request of code with header h, and no body.
func (r *sendRequest) init(code protocol.RequestCode, h protocol.SendMessageRequestHeader) {
	r.h = protocol.SendV2Fields(h)
	r.cmd = protocol.Command{Code: int32(code), Language: protocol.LangGo, Version: protocol.Version, Fields: &r.h}
}
