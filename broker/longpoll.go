package broker

import (
	"sync"
	"sync/atomic"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/remoting"
)

// longPoll parks pulls that found nothing until the dispatcher appends a message they can
// use, or their suspend time runs out.
//
// # Notes
//
// RocketMQ re-queues a parked request and re-runs it from a scanning thread every few
// seconds as well as on arrival. Here each parked pull is a goroutine blocked on its waiter's
// channel; an arrival wakes exactly the waiters of that queue whose filter admits the
// message's tag code, so an idle queue costs nothing and a busy one answers at once.
//
// The dispatcher checks tag codes only, never a filter's Match (SQL92, Wasm): it runs under
// this table's lock on the store's single dispatch goroutine, where one slow Wasm call
// would hold up every queue's dispatch and every pull's parking. A woken pull instead reads
// with its full filter on its own goroutine: the arrivals since it parked go to the filter
// as one batch (wake-ups coalesce in the waiter's one-slot channel), and when none matches
// the pull moves past them and parks again without answering (processPull). So filters are
// evaluated per wake-up and window, not per parked pull per message, and a slow filter
// delays only the pulls that use it.
type longPoll struct {
	parked atomic.Int64 // fast path: the dispatcher skips the lock when nobody waits
	// waiting counts parked pulls that read once more after parking, found nothing and now
	// block until an arrival or their timeout (what an operator sees as idle long polls).
	waiting atomic.Int64

	mu      sync.Mutex
	waiters map[pollKey]map[*pollWaiter]struct{}
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

type pollWaiter struct {
	key    pollKey
	owner  pollOwner     // who parked: a newer pull by the same owner of the same queue supersedes this one
	offset int64         // guarded by longPoll.mu once parked
	filter *store.Filter // the dispatcher checks its tag codes only
	ready  chan struct{} // capacity 1; a send never blocks
	// superseded is set when the same owner parked a newer pull on the same queue: the client
	// has given up on this one (it timed out, or seeked), so it answers at once.
	superseded atomic.Bool
}

func newLongPoll() *longPoll {
	return &longPoll{waiters: map[pollKey]map[*pollWaiter]struct{}{}}
}

// park registers a waiter for messages at or after offset. Register before reading the queue
// so that an arrival between the read and the wait is not missed.
//
// owner identifies who is waiting (the broker uses the connection and the consumer group);
// the zero owner never supersedes anything. A client that gives up on a parked pull and sends
// another for the same queue would otherwise leave the old one holding a request slot of its
// connection until the suspend time ends.
func (l *longPoll) park(topic string, queueID int32, offset int64, f *store.Filter, owner pollOwner) *pollWaiter {
	w := &pollWaiter{key: pollKey{topic, queueID}, owner: owner, offset: offset, filter: f, ready: make(chan struct{}, 1)}
	l.mu.Lock()
	set := l.waiters[w.key]
	if set == nil {
		set = map[*pollWaiter]struct{}{}
		l.waiters[w.key] = set
	}
	l.supersedeLocked(set, owner)
	set[w] = struct{}{}
	l.mu.Unlock()
	l.parked.Add(1)
	return w
}

// supersede answers the owner's pulls parked on a queue, for a newer pull of that queue that
// is answered without parking.
func (l *longPoll) supersede(topic string, queueID int32, owner pollOwner) {
	if l.parked.Load() == 0 || owner == (pollOwner{}) {
		return
	}
	l.mu.Lock()
	l.supersedeLocked(l.waiters[pollKey{topic, queueID}], owner)
	l.mu.Unlock()
}

func (l *longPoll) supersedeLocked(set map[*pollWaiter]struct{}, owner pollOwner) {
	if owner == (pollOwner{}) {
		return
	}
	for old := range set {
		if old.owner == owner && !old.superseded.Load() {
			old.superseded.Store(true)
			wake(old)
		}
	}
}

// advance moves a parked pull's offset past messages it read and rejected, so that only
// later arrivals wake it.
func (l *longPoll) advance(w *pollWaiter, offset int64) {
	l.mu.Lock()
	w.offset = offset
	l.mu.Unlock()
}

func (l *longPoll) unpark(w *pollWaiter) {
	l.mu.Lock()
	set := l.waiters[w.key]
	if _, ok := set[w]; ok {
		delete(set, w)
		if len(set) == 0 {
			delete(l.waiters, w.key)
		}
		l.parked.Add(-1)
	}
	l.mu.Unlock()
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
	for w := range l.waiters[key] {
		if ev.QueueOffset < w.offset {
			continue
		}
		if !w.filter.MatchTagsCode(ev.TagsCode) {
			continue
		}
		wake(w)
	}
}

func wake(w *pollWaiter) {
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// wakeAll releases every parked pull, for shutdown.
func (l *longPoll) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, set := range l.waiters {
		for w := range set {
			wake(w)
		}
	}
}
