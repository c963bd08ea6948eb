package pipeline

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/plugins"
	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// closeTimeout bounds the consumer's and the sink's Close when a pipeline ends: the commit
// of the acknowledged offsets and the release of the queue locks.
const closeTimeout = 10 * time.Second

// Transformer turns messages into zero or more messages each; *plugins.Transform is one.
type Transformer interface {
	Apply(ctx context.Context, msgs []plugins.Message) ([][]plugins.Output, error)
}

// State is a pipeline's state.
type State string

// The states of a pipeline.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped"
	StateFailed  State = "failed"
)

// Counters count a pipeline's messages since it started.
type Counters struct {
	// In counts the messages polled and processed (a message sent back and read again from
	// the retry topic counts again).
	In uint64 `json:"in"`
	// Out counts the records the sink acknowledged.
	Out uint64 `json:"out"`
	// Filtered counts the messages the transforms turned into nothing. Messages the
	// selector rejected never leave the broker and are not counted.
	Filtered uint64 `json:"filtered"`
	// Failed counts the messages sent back to the retry topic after MaxAttempts.
	Failed uint64 `json:"failed"`
	// SinkErrors counts failed delivery attempts.
	SinkErrors uint64 `json:"sink_errors"`
}

// QueueStatus is the position of one queue the pipeline reads.
type QueueStatus struct {
	Queue consumer.MessageQueue `json:"queue"`
	// Committed is the group's committed offset (the next message to process), -1 if none.
	Committed int64 `json:"committed"`
	// Lag is the number of messages behind the queue's end, -1 when not known.
	Lag int64 `json:"lag"`
}

// Status is a snapshot of a pipeline.
type Status struct {
	Name  string `json:"name"`
	State State  `json:"state"`
	// Err is why a failed pipeline failed.
	Err        string        `json:"error,omitempty"`
	Queues     []QueueStatus `json:"queues,omitempty"`
	Counters   Counters      `json:"counters"`
	Definition Definition    `json:"definition"`
}

// queueState is the pipeline's view of one source queue. gen moves when a rebalance takes the
// queue away (batches polled before are dropped unprocessed); seekGen moves on a seek (batches
// polled before are dropped, and one being processed does not commit). A queue's state is
// never removed from Pipeline.queues, so a *queueState, and its commitMu, stay the queue's.
type queueState struct {
	// commitMu orders the queue's commits and seeks: a worker's check of seekGen and its
	// commit, advance's commit, and a seek's move and commit. So a batch read before a seek
	// never commits after it. It is held across the round trip to the broker, and so is one
	// per queue: a slow commit holds up no other queue.
	commitMu sync.Mutex

	// Guarded by Pipeline.mu.
	gen, seekGen uint64
	committed    int64
	inflight     int // batches dispatched and not finished
}

type batch struct {
	mq           consumer.MessageQueue
	msgs         []*consumer.Message
	gen, seekGen uint64
}

// Pipeline is one running pipeline. Its methods are safe for concurrent use.
//
// # Lock order
//
//	Manager.mu → Pipeline.mu
//	queueState.commitMu (one queue's at a time) → Pipeline.mu
//
// mu guards the pipeline's state and its queues' (queueState) and is never held across a call
// to the consumer, the sink or a transform, nor while waiting. A queue's commitMu is held
// across the consumer's calls that commit or move that queue (a broker round trip), and no
// goroutine holds two of them: the workers, the poll loop (advance) and a seek commit each
// queue on its own. The poll loop never waits for a commitMu (see advanceQueue).
type Pipeline struct {
	def        Definition
	m          *Manager
	log        *slog.Logger
	c          *consumer.LitePull
	sink       Sink
	transforms []Transformer

	ctx     context.Context // the pipeline's life; cancel kills it
	cancel  context.CancelFunc
	loopCtx context.Context // the poll loop's; cancelled by Stop
	endLoop context.CancelFunc
	workers []chan *batch
	wg      sync.WaitGroup
	done    chan struct{}

	mu         sync.Mutex
	state      State
	err        error
	paused     bool
	gate       chan struct{} // closed while not paused
	pollCancel context.CancelFunc
	loopParked bool
	polling    bool          // between the start of a Poll and the tagging of its batch
	seeking    int           // seeks in progress; polling waits for them
	busy       int           // batches dispatched and not finished
	changed    chan struct{} // closed and replaced when loopParked, busy or inflight change
	queues     map[consumer.MessageQueue]*queueState

	in, out, filtered, failed, sinkErrors atomic.Uint64
}

type selector struct{ typ, expr string }

func (s selector) Type() string       { return s.typ }
func (s selector) Expression() string { return s.expr }

// queue is queueLocked for a caller not holding mu.
func (p *Pipeline) queue(mq consumer.MessageQueue) *queueState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queueLocked(mq)
}

func (p *Pipeline) queueLocked(mq consumer.MessageQueue) *queueState {
	qs := p.queues[mq]
	if qs == nil {
		qs = &queueState{committed: -1}
		p.queues[mq] = qs
	}
	return qs
}

func (p *Pipeline) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// waitFor waits until cond (called with mu held) holds, ctx ends or the pipeline ends.
func (p *Pipeline) waitFor(ctx context.Context, cond func() bool) error {
	for {
		p.mu.Lock()
		if cond() {
			p.mu.Unlock()
			return nil
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return ErrNotRunning
		}
	}
}

// start starts the consumer and the pipeline's goroutines.
func (p *Pipeline) start(ctx context.Context) error {
	if err := p.c.Start(ctx); err != nil {
		return fmt.Errorf("pipeline %s: start consumer: %w", p.def.Name, err)
	}
	p.workers = make([]chan *batch, p.def.Parallelism)
	for i := range p.workers {
		p.workers[i] = make(chan *batch, 1)
		p.wg.Add(1)
		go p.work(p.workers[i])
	}
	go p.run()
	return nil
}

// run polls until the pipeline stops, then closes it down.
func (p *Pipeline) run() {
	err := p.pollLoop()
	for _, ch := range p.workers {
		close(ch)
	}
	p.wg.Wait()
	killed := p.ctx.Err() != nil
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	// The consumer commits, for each queue, the offset this pipeline committed last: what
	// the sink acknowledged. Nothing in flight is committed.
	if cerr := p.c.Close(ctx); cerr != nil {
		p.log.Warn("close consumer", "err", cerr)
	}
	if serr := p.sink.Close(ctx); serr != nil {
		p.log.Warn("close sink", "err", serr)
	}
	p.mu.Lock()
	p.state = StateStopped
	if err != nil {
		p.state, p.err = StateFailed, err
	}
	p.mu.Unlock()
	p.cancel()
	// The event goes out before done closes, so that it precedes whatever the caller of
	// Stop does next (the daemon stops the broker and publishes broker.stopping).
	switch {
	case err != nil:
		p.log.Error("pipeline failed", "err", err)
		p.m.emit(EventFailed, p.def.Name, err)
	case killed:
		p.m.emit(EventStopped, p.def.Name, context.Cause(p.ctx))
	default:
		p.m.emit(EventStopped, p.def.Name, nil)
	}
	close(p.done)
}

// finished reports whether the pipeline has stopped or failed: its consumer and sink are
// closed. Lock order: Manager.mu before Pipeline.mu.
func (p *Pipeline) finished() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == StateStopped || p.state == StateFailed
}

// advanceInterval is how often, at most, a busy pipeline commits past the messages its
// selector rejected (see advance); an idle one does so after every empty poll.
const advanceInterval = time.Second

// pollLoop polls batches and hands each to the worker of its queue, until Stop or a kill.
func (p *Pipeline) pollLoop() error {
	var lastAdvance time.Time
	for {
		p.mu.Lock()
		for p.paused || p.seeking > 0 {
			wake := p.changed
			if p.paused {
				wake = p.gate
				p.loopParked = true
				p.notifyLocked()
			}
			p.mu.Unlock()
			select {
			case <-wake:
			case <-p.loopCtx.Done():
				return nil
			}
			p.mu.Lock()
		}
		p.loopParked = false
		p.polling = true
		pollCtx, cancel := context.WithCancel(p.loopCtx)
		p.pollCancel = cancel
		p.mu.Unlock()
		msgs, err := p.c.Poll(pollCtx)
		cancel()
		p.dispatch(msgs)
		if p.loopCtx.Err() != nil {
			return nil
		}
		if now := time.Now(); len(msgs) == 0 || now.Sub(lastAdvance) >= advanceInterval {
			p.advance(p.loopCtx)
			lastAdvance = now
		}
		if err != nil && pollCtx.Err() == nil {
			return fmt.Errorf("poll: %w", err)
		}
	}
}

// dispatch tags a polled batch with its queue's generations and hands it to the queue's
// worker. It ends the poll (polling): a seek waits for that, so that no batch read before
// the seek is tagged after it.
func (p *Pipeline) dispatch(msgs []*consumer.Message) {
	p.mu.Lock()
	p.polling = false
	p.notifyLocked()
	if len(msgs) == 0 {
		p.mu.Unlock()
		return
	}
	mq := msgs[0].Queue
	qs := p.queueLocked(mq)
	qs.inflight++
	p.busy++
	b := &batch{mq: mq, msgs: msgs, gen: qs.gen, seekGen: qs.seekGen}
	p.mu.Unlock()
	select {
	case p.workers[workerOf(mq, len(p.workers))] <- b:
	case <-p.ctx.Done():
		p.finish(b)
	}
}

// workerOf is the worker, of n, that processes mq's batches: always the same one, so that a
// queue's batches are processed in order.
func workerOf(mq consumer.MessageQueue, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(mq.String()))
	return int(h.Sum32() % uint32(n))
}

// finish records that b is done with.
func (p *Pipeline) finish(b *batch) {
	p.mu.Lock()
	p.queueLocked(b.mq).inflight--
	p.busy--
	p.notifyLocked()
	p.mu.Unlock()
}

func (p *Pipeline) work(ch chan *batch) {
	defer p.wg.Done()
	for b := range ch {
		if p.ctx.Err() == nil {
			p.process(b)
		}
		p.finish(b)
	}
}

// current tells whether b is still to be processed (its queue was neither taken away nor
// sought since b was polled).
func (p *Pipeline) current(b *batch) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	qs := p.queueLocked(b.mq)
	return qs.gen == b.gen && qs.seekGen == b.seekGen
}

// process delivers every record of b, sends back what cannot be delivered, and then
// commits past b. It returns without committing when the pipeline is killed.
func (p *Pipeline) process(b *batch) {
	if !p.current(b) {
		return
	}
	ctx := p.ctx
	p.in.Add(uint64(len(b.msgs)))
	records, err := p.transform(ctx, b.msgs)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("transforms failed; sending the batch back", "queue", b.mq.String(), "err", err)
		for _, m := range b.msgs {
			if p.sendBack(ctx, m) != nil {
				return
			}
		}
	} else {
		for i, m := range b.msgs {
			if len(records[i]) == 0 {
				p.filtered.Add(1)
				continue
			}
			if err := p.deliver(ctx, records[i]); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Warn("delivery failed; sending the message back", "msg", m.MsgID, "attempts", p.def.MaxAttempts, "err", err)
				if p.sendBack(ctx, m) != nil {
					return
				}
			}
		}
	}
	p.commit(ctx, b)
}

// commit commits the offset past b unless a seek moved the queue meanwhile.
func (p *Pipeline) commit(ctx context.Context, b *batch) {
	next := b.msgs[len(b.msgs)-1].QueueOffset + 1
	qs := p.queue(b.mq)
	qs.commitMu.Lock()
	defer qs.commitMu.Unlock()
	p.mu.Lock()
	stale := qs.seekGen != b.seekGen
	p.mu.Unlock()
	if stale {
		return
	}
	if err := p.c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{b.mq: next}); err != nil {
		// Not ours any more, or the broker is unreachable: the next owner (or the next
		// batch) reads on from the last commit, so at worst messages are delivered again.
		p.log.Warn("commit", "queue", b.mq.String(), "offset", next, "err", err)
		return
	}
	p.mu.Lock()
	qs.committed = next
	p.mu.Unlock()
}

// advance commits the consumer's position of every owned queue with no batch in flight when
// it is past the offset committed last: the broker skipped messages the selector rejected,
// which no batch commits, and without this a queue whose messages are all rejected would
// never be committed (its lag unknown, or growing). It runs on the poll loop between two
// polls, so every batch Poll handed out has been dispatched and counts as in flight until
// its worker is done with it.
func (p *Pipeline) advance(ctx context.Context) {
	for _, mq := range p.c.Assignment() {
		p.advanceQueue(ctx, mq)
	}
}

// advanceQueue commits mq's position as advance says. It runs on the poll loop, which must
// not wait for a commit: a queue whose commitMu is taken is being committed (by the worker
// of a batch, which then counts in flight) or sought, and is left for the next advance.
func (p *Pipeline) advanceQueue(ctx context.Context, mq consumer.MessageQueue) {
	qs := p.queue(mq)
	if !qs.commitMu.TryLock() {
		return
	}
	defer qs.commitMu.Unlock()
	p.mu.Lock()
	idle, committed := qs.inflight == 0 && p.seeking == 0, qs.committed
	p.mu.Unlock()
	if !idle {
		return
	}
	pos, err := p.c.Position(mq)
	if err != nil || pos <= committed {
		return // not read yet, or being taken away; or nothing new
	}
	if err := p.c.CommitOffsets(ctx, map[consumer.MessageQueue]int64{mq: pos}); err != nil {
		p.log.Debug("commit past filtered messages", "queue", mq.String(), "offset", pos, "err", err)
		return
	}
	p.mu.Lock()
	qs.committed = pos
	p.mu.Unlock()
}

// backoff returns the wait after the attempt-th failure (1-based).
func (p *Pipeline) backoff(attempt int) time.Duration {
	d := time.Duration(p.def.RetryBackoff)
	for i := 1; i < attempt && d < time.Duration(p.def.MaxBackoff); i++ {
		d *= 2
	}
	return min(d, time.Duration(p.def.MaxBackoff))
}

func (p *Pipeline) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// deliver hands one message's records to the sink, each up to MaxAttempts times.
func (p *Pipeline) deliver(ctx context.Context, recs []Record) error {
	for i := range recs {
		var err error
		for attempt := 1; ; attempt++ {
			actx, cancel := context.WithTimeout(ctx, time.Duration(p.def.Sink.Timeout))
			err = p.sink.Deliver(actx, &recs[i])
			cancel()
			if err == nil {
				p.out.Add(1)
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			p.sinkErrors.Add(1)
			if attempt >= p.def.MaxAttempts {
				return fmt.Errorf("record %s after %d attempts: %w", recs[i].MsgID, attempt, err)
			}
			if err := p.sleep(ctx, p.backoff(attempt)); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendBack sends m to the group's retry topic, trying until it succeeds or the pipeline is
// killed: m must not be committed past before it is either delivered or sent back.
func (p *Pipeline) sendBack(ctx context.Context, m *consumer.Message) error {
	for attempt := 1; ; attempt++ {
		err := p.c.SendBack(ctx, m, p.def.RetryDelayLevel)
		if err == nil {
			p.failed.Add(1)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Warn("send back", "msg", m.MsgID, "attempt", attempt, "err", err)
		if err := p.sleep(ctx, p.backoff(attempt)); err != nil {
			return err
		}
	}
}

// transform runs the transforms over msgs (each up to MaxAttempts times) and returns each
// message's records.
func (p *Pipeline) transform(ctx context.Context, msgs []*consumer.Message) ([][]Record, error) {
	cur := make([]plugins.Message, len(msgs))
	for i, m := range msgs {
		cur[i] = plugins.Message{
			Topic: m.Topic, QueueID: int32(m.Queue.QueueID), QueueOffset: m.QueueOffset,
			StoreTimestamp: m.StoreTimestamp.UnixMilli(), Tags: m.Tags, Keys: strings.Join(m.Keys, " "),
			Properties: protocol.AppendProperties(nil, userProperties(m.Properties())), Body: m.Body,
		}
	}
	// origin[i] is the index in msgs of cur[i].
	origin := make([]int, len(msgs))
	for i := range origin {
		origin[i] = i
	}
	for ti, t := range p.transforms {
		var outs [][]plugins.Output
		var err error
		for attempt := 1; ; attempt++ {
			outs, err = t.Apply(ctx, cur)
			if err == nil || errors.Is(err, runtime.ErrPolicyOpen) {
				if err != nil {
					p.log.Warn("transform failed open; messages pass unchanged", "transform", p.def.Transforms[ti], "err", err)
				}
				break
			}
			if ctx.Err() != nil || attempt >= p.def.MaxAttempts {
				return nil, fmt.Errorf("transform %s: %w", p.def.Transforms[ti], err)
			}
			if err := p.sleep(ctx, p.backoff(attempt)); err != nil {
				return nil, err
			}
		}
		var next []plugins.Message
		var nextOrigin []int
		for i, os := range outs {
			for _, o := range os {
				next = append(next, plugins.Message{
					Topic: cur[i].Topic, QueueID: cur[i].QueueID, QueueOffset: cur[i].QueueOffset,
					StoreTimestamp: cur[i].StoreTimestamp, Tags: o.Tags, Keys: o.Keys, Properties: o.Properties, Body: o.Body,
				})
				nextOrigin = append(nextOrigin, origin[i])
			}
		}
		cur, origin = next, nextOrigin
	}
	records := make([][]Record, len(msgs))
	for i, pm := range cur {
		src := msgs[origin[i]]
		props, err := protocol.DecodeProperties(pm.Properties)
		if err != nil {
			return nil, fmt.Errorf("transform output of %s: properties: %w", src.MsgID, err)
		}
		id := src.MsgID
		if n := len(records[origin[i]]); n > 0 {
			id += "-" + strconv.Itoa(n)
		}
		records[origin[i]] = append(records[origin[i]], Record{
			Topic: src.Topic, QueueID: int32(src.Queue.QueueID), QueueOffset: src.QueueOffset, MsgID: id,
			Tags: pm.Tags, Keys: strings.Fields(pm.Keys), Properties: props, Body: pm.Body,
		})
	}
	return records, nil
}

// userProperties drops the properties the broker and producers set themselves.
func userProperties(props map[string]string) map[string]string {
	out := make(map[string]string, len(props))
	for k, v := range props {
		if !systemProperty(k) {
			out[k] = v
		}
	}
	return out
}

// onRevoked runs when a rebalance takes queues away: batches of them not yet started are
// dropped (the next owner reads them from the committed offset), and the hand-over waits for
// the batch being processed, which commits what the sink acknowledged.
func (p *Pipeline) onRevoked(ctx context.Context, queues []consumer.MessageQueue) {
	p.mu.Lock()
	for _, mq := range queues {
		p.queueLocked(mq).gen++
	}
	p.mu.Unlock()
	err := p.waitFor(ctx, func() bool {
		for _, mq := range queues {
			if p.queueLocked(mq).inflight > 0 {
				return false
			}
		}
		return true
	})
	if err != nil && !errors.Is(err, ErrNotRunning) {
		p.log.Warn("revoke: in-flight batches did not finish", "err", err)
	}
}

// pause stops polling and waits until every polled batch is processed.
func (p *Pipeline) pause(ctx context.Context) error {
	p.mu.Lock()
	if p.state != StateRunning && p.state != StatePaused {
		p.mu.Unlock()
		return fmt.Errorf("pause %s: %w", p.def.Name, ErrNotRunning)
	}
	if !p.paused {
		p.paused = true
		p.state = StatePaused
		p.gate = make(chan struct{})
		if p.pollCancel != nil {
			p.pollCancel()
		}
	}
	p.mu.Unlock()
	if err := p.waitFor(ctx, func() bool { return p.loopParked && p.busy == 0 }); err != nil {
		return fmt.Errorf("pause %s: %w", p.def.Name, err)
	}
	return nil
}

func (p *Pipeline) resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != StateRunning && p.state != StatePaused {
		return fmt.Errorf("resume %s: %w", p.def.Name, ErrNotRunning)
	}
	if p.paused {
		p.paused = false
		p.state = StateRunning
		close(p.gate)
	}
	return nil
}

// stop drains: polling stops, polled batches are processed and committed, the consumer
// closes. If ctx ends first the pipeline is killed instead.
func (p *Pipeline) stop(ctx context.Context) error {
	p.endLoop()
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		p.cancel()
		<-p.done
		return fmt.Errorf("stop %s: drain cut short: %w", p.def.Name, ctx.Err())
	}
}

func (p *Pipeline) counters() Counters {
	return Counters{In: p.in.Load(), Out: p.out.Load(), Filtered: p.filtered.Load(), Failed: p.failed.Load(), SinkErrors: p.sinkErrors.Load()}
}

// status snapshots the pipeline; committed offsets of owned queues are read from the broker.
func (p *Pipeline) status(ctx context.Context) Status {
	p.mu.Lock()
	st := Status{Name: p.def.Name, State: p.state, Definition: p.def}
	if p.err != nil {
		st.Err = p.err.Error()
	}
	p.mu.Unlock()
	st.Counters = p.counters()
	if st.State != StateRunning && st.State != StatePaused {
		return st
	}
	owned := p.c.Assignment()
	slices.SortFunc(owned, func(a, b consumer.MessageQueue) int { return strings.Compare(a.String(), b.String()) })
	for _, mq := range owned {
		qs := QueueStatus{Queue: mq, Committed: -1, Lag: -1}
		if off, err := p.c.Committed(ctx, mq); err == nil {
			qs.Committed = off
		}
		if end := p.m.opts.QueueEnd; end != nil && qs.Committed >= 0 && len(p.def.SourceNameServers) == 0 {
			if hi, ok := end(mq); ok {
				qs.Lag = max(hi-qs.Committed, 0)
			}
		}
		st.Queues = append(st.Queues, qs)
	}
	return st
}
