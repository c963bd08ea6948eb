package broker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
)

// longPoll parks pulls that found nothing until the dispatcher appends a message they can
// use, or their suspend time runs out.
//
// # Notes
//
// RocketMQ re-queues a parked request and re-runs it from a scanning thread every few
// seconds as well as on arrival. Here a parked pull is a waiter in its queue's list and in
// one deadline heap, answered later through its request's remoting.Deferred: it holds no
// goroutine and no timer of its own (a few hundred bytes in all, where a goroutine's stack
// alone is 4 KiB or more). An arrival wakes exactly the waiters of that queue whose filter
// admits the message's tag code, so an idle queue costs nothing and a busy one answers at
// once; the one timer of the table wakes the waiters whose suspend time ran out.
//
// A woken waiter is run (its read redone, and answered or parked again) on a goroutine of
// the table's small pool of idle runners, or a new one when none is idle: never on the
// dispatcher's goroutine, which must not wait for a read, a filter or a socket, and never
// behind another waiter's run, so a slow filter delays only the pulls that use it. A waiter
// is run by one goroutine at a time; an event that comes while it runs is kept (pending) and
// makes it run again rather than wait, so nothing is lost between its read and its rest.
//
// The dispatcher checks tag codes only, never a filter's Match (SQL92, Wasm): it runs under
// this table's lock on the store's single dispatch goroutine, where one slow Wasm call
// would hold up every queue's dispatch and every pull's parking. A woken pull instead reads
// with its full filter on its runner: the arrivals since it last read go to the filter as
// one batch (wake-ups coalesce while it runs or waits for a runner), and when none matches
// the pull moves past them and parks again without answering (serveParked). So filters are
// evaluated per wake-up and window, not per parked pull per message.
type longPoll struct {
	parked atomic.Int64 // fast path: the dispatcher skips the lock when nobody waits
	// waiting counts parked pulls that read once more after parking, found nothing and now
	// wait for an arrival or their timeout (what an operator sees as idle long polls).
	waiting atomic.Int64

	// run serves a woken pull waiter (Broker.serveParked), on a runner goroutine.
	run func(*pollWaiter)
	// work hands a woken waiter to an idle runner (unbuffered: a send succeeds only when one
	// waits); idleRunners counts those waiting.
	work        chan *pollWaiter
	idleRunners atomic.Int32
	done        chan struct{} // closed by wakeAll: idle runners end

	mu      sync.Mutex
	waiters map[pollKey]*pollWaiter // guarded by mu: the first waiter of each queue's list
	closed  bool                    // guarded by mu: shutting down, every pull answers now
	// The suspend deadlines of the parked pulls, a min-heap, and the one timer armed for the
	// earliest (timerAt, in nanoseconds since epoch; 0: not armed).
	deadlines []*pollWaiter // guarded by mu
	timer     *time.Timer   // guarded by mu; created on first use
	timerAt   int64         // guarded by mu
	epoch     time.Time
}

// pollKey is the queue a pull waits on. A struct, not "topic@queue": the dispatcher looks it
// up for every message while anyone waits, and building a string would allocate each time.
type pollKey struct {
	topic   string
	queueID int32
}

// pollOwner identifies the parked pulls of one consumer group on one connection. The zero
// value is no owner: it never supersedes anything.
type pollOwner struct {
	conn  *remoting.Conn
	group string
}

// pollWaiter is a parked pull (or, with ready set, the delay service waiting on a queue).
// Its fields below the list links are what the pull needs to read again and answer; it keeps
// nothing of the request else.
type pollWaiter struct {
	key  pollKey
	prev *pollWaiter // guarded by longPoll.mu: the queue's list
	next *pollWaiter

	owner  pollOwner     // who parked: a newer pull by the same owner of the same queue supersedes this one
	offset int64         // guarded by longPoll.mu once parked: where the pull reads next
	filter *store.Filter // the dispatcher checks its tag codes only

	// ready, when not nil, makes this a plain waiter: a wake-up is a token on it (capacity 1,
	// a send never blocks) and nobody runs it.
	ready chan struct{}

	// Guarded by longPoll.mu.
	linked   bool  // in its queue's list: not answered, not dropped
	running  bool  // a goroutine is serving it (reading, answering or about to wait)
	pending  bool  // an event came while it ran: run again
	final    bool  // answer with what there is: out of time, superseded, or shutting down
	heapAt   int32 // index in deadlines, -1 when not there
	deadline int64 // nanoseconds since longPoll.epoch

	// The pull, set before it parks and read-only afterwards.
	d         remoting.Deferred
	requested int64 // the queue offset the request asked for (for the answer's code)
	began     int64 // when the request began, in nanoseconds since longPoll.epoch (with an Observer)
	maxMsgs   int32
	maxBytes  int32
	zeroCopy  bool
}

// maxIdleRunners bounds the goroutines kept waiting to run woken waiters; runnerIdle is how
// long one waits before it ends. Past the bound, a woken waiter gets a new goroutine.
const (
	maxIdleRunners = 8
	runnerIdle     = 5 * time.Second
)

func newLongPoll(run func(*pollWaiter)) *longPoll {
	return &longPoll{run: run, work: make(chan *pollWaiter), done: make(chan struct{}),
		waiters: map[pollKey]*pollWaiter{}, epoch: time.Now()}
}

// now is the table's clock, in nanoseconds since epoch (monotonic).
func (l *longPoll) now() int64 { return int64(time.Since(l.epoch)) }

// watch registers a plain waiter for messages at or after offset: an arrival sends a token
// on its ready channel. Register before reading the queue so that an arrival between the
// read and the wait is not missed; unpark when done.
func (l *longPoll) watch(topic string, queueID int32, offset int64) *pollWaiter {
	w := &pollWaiter{key: pollKey{topic, queueID}, offset: offset, ready: make(chan struct{}, 1), heapAt: -1}
	l.mu.Lock()
	l.linkLocked(w)
	l.mu.Unlock()
	return w
}

// park registers a pull waiter (its key, owner, offset, filter and pull fields set) that is
// to be answered within wait. The caller is its first runner: it must read the queue once
// more (an arrival between its first read and now has not woken it) and end with rest or
// an answer, as serveParked does.
//
// owner identifies who is waiting (the broker uses the connection and the consumer group);
// the zero owner never supersedes anything. A client that gives up on a parked pull and sends
// another for the same queue would otherwise leave the old one holding a parked slot of its
// connection until the suspend time ends.
func (l *longPoll) park(w *pollWaiter, wait time.Duration) {
	w.deadline = l.now() + int64(wait)
	w.heapAt = -1
	w.running = true
	l.mu.Lock()
	defer l.mu.Unlock()
	l.supersedeLocked(w.key, w.owner)
	l.linkLocked(w)
	if l.closed {
		w.final = true
	}
	l.pushDeadlineLocked(w)
}

func (l *longPoll) linkLocked(w *pollWaiter) {
	if head := l.waiters[w.key]; head != nil {
		w.next = head
		head.prev = w
	}
	l.waiters[w.key] = w
	w.linked = true
	l.parked.Add(1)
}

// supersede answers the owner's pulls parked on a queue, for a newer pull of that queue that
// is answered without parking.
func (l *longPoll) supersede(topic string, queueID int32, owner pollOwner) {
	if l.parked.Load() == 0 || owner == (pollOwner{}) {
		return
	}
	l.mu.Lock()
	l.supersedeLocked(pollKey{topic, queueID}, owner)
	l.mu.Unlock()
}

func (l *longPoll) supersedeLocked(key pollKey, owner pollOwner) {
	if owner == (pollOwner{}) {
		return
	}
	for old := l.waiters[key]; old != nil; old = old.next {
		if old.owner == owner && !old.final {
			l.wakeLocked(old, true)
		}
	}
}

// reading returns where a running waiter reads and whether it must answer now, and clears
// its pending event: the read it is about to do covers that event.
func (l *longPoll) reading(w *pollWaiter) (offset int64, final bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w.pending = false
	if l.closed {
		w.final = true
	}
	return w.offset, w.final
}

// advance moves a parked pull's offset past messages it read and rejected, so that only
// later arrivals wake it.
func (l *longPoll) advance(w *pollWaiter, offset int64) {
	l.mu.Lock()
	w.offset = offset
	l.mu.Unlock()
}

// rest ends a run of w that found nothing to answer with. It reports true when w must run
// again at once (an event came during the run); otherwise w waits for the next event with no
// goroutine, or was dropped (its connection closed) and is forgotten.
func (l *longPoll) rest(w *pollWaiter) (again bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !w.linked {
		return false
	}
	if w.pending || w.final || l.closed {
		return true
	}
	w.running = false
	l.waiting.Add(1)
	return false
}

// unpark takes a waiter out of the table: answered, dropped with its connection, or a plain
// waiter done waiting. It may be called more than once.
func (l *longPoll) unpark(w *pollWaiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !w.linked {
		return
	}
	w.linked = false
	if w.prev != nil {
		w.prev.next = w.next
	} else if w.next != nil {
		l.waiters[w.key] = w.next
	} else {
		delete(l.waiters, w.key)
	}
	if w.next != nil {
		w.next.prev = w.prev
	}
	w.prev, w.next = nil, nil
	l.removeDeadlineLocked(w)
	l.parked.Add(-1)
	if w.ready == nil && !w.running {
		l.waiting.Add(-1)
	}
}

// arrived wakes the waiters a newly dispatched message may satisfy. It runs on the store's
// dispatch goroutine and never blocks.
func (l *longPoll) arrived(ev store.DispatchEvent) {
	if l.parked.Load() == 0 {
		return
	}
	key := pollKey{ev.Topic, ev.QueueID}
	l.mu.Lock()
	defer l.mu.Unlock()
	for w := l.waiters[key]; w != nil; w = w.next {
		if ev.QueueOffset < w.offset {
			continue
		}
		if !w.filter.MatchTagsCode(ev.TagsCode) {
			continue
		}
		l.wakeLocked(w, false)
	}
}

// wakeLocked tells w that something happened: a message may have arrived, or (final) it must
// answer now. A plain waiter gets a token; a pull waiter is handed to a runner unless one is
// serving it already, which then runs it again.
func (l *longPoll) wakeLocked(w *pollWaiter, final bool) {
	if w.ready != nil {
		select {
		case w.ready <- struct{}{}:
		default:
		}
		return
	}
	if !w.linked {
		return
	}
	if final {
		w.final = true
	}
	if w.running {
		w.pending = true
		return
	}
	w.running = true
	l.waiting.Add(-1)
	select {
	case l.work <- w: // an idle runner takes it
	default:
		go l.runner(w)
	}
}

// runner runs w and then, while fewer than maxIdleRunners others wait, waits up to runnerIdle
// for the next woken waiter instead of ending: its stack has grown through the read path
// once, and a wake-up handed to a waiting goroutine costs less than a new one.
func (l *longPoll) runner(w *pollWaiter) {
	var idle *time.Timer
	for {
		l.run(w)
		if l.idleRunners.Add(1) > maxIdleRunners {
			l.idleRunners.Add(-1)
			return
		}
		if idle == nil {
			idle = time.NewTimer(runnerIdle)
		} else {
			idle.Reset(runnerIdle)
		}
		select {
		case w = <-l.work:
			l.idleRunners.Add(-1)
		case <-idle.C:
			l.idleRunners.Add(-1)
			return
		case <-l.done:
			l.idleRunners.Add(-1)
			idle.Stop()
			return
		}
	}
}

// wakeAll makes every parked pull answer now, and every pull that parks later answer at
// once, for shutdown; plain waiters get a token.
func (l *longPoll) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.done)
		if l.timer != nil {
			l.timer.Stop()
		}
	}
	for _, head := range l.waiters {
		for w := head; w != nil; w = w.next {
			l.wakeLocked(w, true)
		}
	}
}

// The deadline heap: a min-heap of pull waiters by deadline, w.heapAt their index.

func (l *longPoll) pushDeadlineLocked(w *pollWaiter) {
	w.heapAt = int32(len(l.deadlines))
	l.deadlines = append(l.deadlines, w)
	l.upLocked(int(w.heapAt))
	if w.heapAt == 0 && !l.closed && (l.timerAt == 0 || w.deadline < l.timerAt) {
		l.armLocked(w.deadline)
	}
}

func (l *longPoll) removeDeadlineLocked(w *pollWaiter) {
	i := int(w.heapAt)
	if i < 0 {
		return
	}
	last := len(l.deadlines) - 1
	if i != last {
		l.swapLocked(i, last)
	}
	l.deadlines[last] = nil
	l.deadlines = l.deadlines[:last]
	w.heapAt = -1
	if i != last {
		if !l.upLocked(i) {
			l.downLocked(i)
		}
	}
	// The timer may stay armed for w's deadline: it then finds nothing due and re-arms.
	if len(l.deadlines) == 0 && cap(l.deadlines) > 1024 {
		l.deadlines = nil // a burst of parked pulls is over: let the array go
	}
}

func (l *longPoll) swapLocked(i, j int) {
	h := l.deadlines
	h[i], h[j] = h[j], h[i]
	h[i].heapAt, h[j].heapAt = int32(i), int32(j)
}

// upLocked moves the waiter at i up to its place and reports whether it moved.
func (l *longPoll) upLocked(i int) bool {
	moved := false
	for i > 0 {
		parent := (i - 1) / 2
		if l.deadlines[parent].deadline <= l.deadlines[i].deadline {
			break
		}
		l.swapLocked(i, parent)
		i = parent
		moved = true
	}
	return moved
}

func (l *longPoll) downLocked(i int) {
	h := l.deadlines
	for {
		least := i
		if c := 2*i + 1; c < len(h) && h[c].deadline < h[least].deadline {
			least = c
		}
		if c := 2*i + 2; c < len(h) && h[c].deadline < h[least].deadline {
			least = c
		}
		if least == i {
			return
		}
		l.swapLocked(i, least)
		i = least
	}
}

// armLocked sets the table's timer to fire at the deadline at (nanoseconds since epoch).
func (l *longPoll) armLocked(at int64) {
	l.timerAt = at
	d := time.Duration(at - l.now())
	if l.timer == nil {
		l.timer = time.AfterFunc(d, l.expire)
		return
	}
	l.timer.Reset(d)
}

// expire is the timer's function: it makes the pulls whose suspend time ran out answer, and
// arms the timer for the next deadline.
func (l *longPoll) expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.timerAt = 0
	if l.closed {
		return
	}
	now := l.now()
	for len(l.deadlines) > 0 && l.deadlines[0].deadline <= now {
		w := l.deadlines[0]
		l.removeDeadlineLocked(w)
		l.wakeLocked(w, true)
	}
	if len(l.deadlines) > 0 {
		l.armLocked(l.deadlines[0].deadline)
	}
}
