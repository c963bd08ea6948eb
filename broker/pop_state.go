package broker

import (
	"container/heap"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// popWindow bounds, per (group, topic, queue), how far past the consumed offset (every
// offset below it acknowledged or dead-lettered) the broker hands messages out: at most
// popWindow offsets are read and not yet done, so a group's memory is bounded by its queues
// whatever its receivers leave unacknowledged. A queue whose window is full hands out
// nothing new until its oldest message is acknowledged, dead-lettered or redelivered.
const popWindow = 1024

// popKey names the pop progress of one group in one queue.
type popKey struct {
	group, topic string
	queueID      int32
}

// popEntry is one message of a queue's window that is not done: in flight (handed out,
// invisible until deadline), or visible (expired, or FIFO-held: read but not handed out
// because an earlier message of its message group is outstanding).
type popEntry struct {
	q        *popQueue
	offset   int64
	attempt  int32 // deliveries so far; 0 for a message never handed out
	inflight bool
	epoch    uint64
	popTime  int64 // Unix ms of the last hand-out
	firstPop int64 // Unix ms of the first hand-out (0: not known, the entry came back from a journal record without it)
	deadline int64 // Unix ms: invisible until (in flight only)
	msgGroup string
	// hidx (index in the deadline heap, -1 when not in it) and hdeadline (the deadline the
	// heap orders by) belong to popTimers.mu; the fields above to the queue's lock.
	hidx      int
	hdeadline int64
}

// popQueue is a group's pop progress in one queue. mu guards everything but key.
type popQueue struct {
	key  popKey
	fifo bool // the group consumes in order (GroupConfig.ConsumeOrderly) when the state was made

	mu      sync.Mutex
	jid     uint32 // the queue's id in the current journal generation
	start   int64  // consumed offset: every offset below it is done
	next    int64  // the next offset to read fresh; [start, next) is the window
	entries map[int64]*popEntry
	visible []int64 // offsets of entries not in flight, unordered
	// groups: for FIFO queues, the outstanding offsets of each message group, ascending; an
	// entry may be handed out only when it is the first of its group.
	groups   map[string][]int64
	inflight int
	seen     time.Time // when a receive last marked the group active
	receiver string    // the last receive's ClientID
	acked    uint64
	dlq      uint64
	redeliv  uint64
}

func newPopQueue(key popKey, start int64, fifo bool) *popQueue {
	return &popQueue{key: key, fifo: fifo, start: start, next: start, entries: map[int64]*popEntry{}, groups: map[string][]int64{}}
}

// eligible reports whether e may be handed out: always, unless FIFO holds it behind an
// earlier message of its message group.
func (q *popQueue) eligible(e *popEntry) bool {
	if !q.fifo || e.msgGroup == "" {
		return true
	}
	g := q.groups[e.msgGroup]
	return len(g) > 0 && g[0] == e.offset
}

// setFIFO follows a change of the group's ConsumeOrderly: the message groups' order is
// rebuilt from the window.
func (q *popQueue) setFIFO(fifo bool) {
	if q.fifo == fifo {
		return
	}
	q.fifo = fifo
	clear(q.groups)
	if !fifo {
		return
	}
	for _, off := range slices.Sorted(maps.Keys(q.entries)) {
		if g := q.entries[off].msgGroup; g != "" {
			q.groups[g] = append(q.groups[g], off)
		}
	}
}

// add puts a freshly read offset into the window, visible.
func (q *popQueue) add(off int64, msgGroup string) *popEntry {
	e := &popEntry{q: q, offset: off, msgGroup: msgGroup, hidx: -1}
	q.entries[off] = e
	if q.fifo && msgGroup != "" {
		q.groups[msgGroup] = append(q.groups[msgGroup], off)
	}
	return e
}

// unvisible removes off from the visible list.
func (q *popQueue) unvisible(off int64) {
	if i := slices.Index(q.visible, off); i >= 0 {
		q.visible[i] = q.visible[len(q.visible)-1]
		q.visible = q.visible[:len(q.visible)-1]
	}
}

// done removes e for good (acknowledged or dead-lettered) and moves start past every done
// offset. It reports whether a FIFO successor became eligible.
func (q *popQueue) done(e *popEntry) (released bool) {
	delete(q.entries, e.offset)
	if e.inflight {
		q.inflight--
		e.inflight = false
	} else {
		q.unvisible(e.offset)
	}
	if q.fifo && e.msgGroup != "" {
		g := q.groups[e.msgGroup]
		if i := slices.Index(g, e.offset); i >= 0 {
			g = slices.Delete(g, i, i+1)
		}
		if len(g) == 0 {
			delete(q.groups, e.msgGroup)
		} else {
			q.groups[e.msgGroup] = g
			next := q.entries[g[0]]
			released = next != nil && !next.inflight
		}
	}
	q.advance()
	return released
}

// advance moves start past the done offsets at the window's low end.
func (q *popQueue) advance() {
	if len(q.entries) == 0 {
		q.start = q.next
		return
	}
	for q.start < q.next {
		if _, ok := q.entries[q.start]; ok {
			return
		}
		q.start++
	}
}

// deadlineHeap is the broker's one min-heap of in-flight deadlines: one timer for all of
// them, not one per message.
type deadlineHeap []*popEntry

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].hdeadline < h[j].hdeadline }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx, h[j].hidx = i, j
}
func (h *deadlineHeap) Push(x any) {
	e := x.(*popEntry)
	e.hidx = len(*h)
	*h = append(*h, e)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	e.hidx = -1
	return e
}

// popTimers holds the deadline heap. Lock order: popQueue.mu before popTimers.mu; the
// expiry loop takes popTimers.mu alone, then each entry's queue.
type popTimers struct {
	mu   sync.Mutex
	h    deadlineHeap
	kick chan struct{} // a deadline earlier than armed was scheduled
	// armed is the deadline the expiry loop sleeps until (0: none): only an earlier one
	// wakes it. Waking it for each receive's first delivery (the heap's top once the
	// acknowledgements emptied it) cost a goroutine wake-up per receive.
	armed int64
}

func (t *popTimers) schedule(e *popEntry) {
	t.mu.Lock()
	e.hdeadline = e.deadline // the caller holds the queue's lock, which guards deadline
	if e.hidx >= 0 {
		heap.Fix(&t.h, e.hidx)
	} else {
		heap.Push(&t.h, e)
	}
	first := t.armed == 0 || e.hdeadline < t.armed
	if first {
		t.armed = e.hdeadline
	}
	t.mu.Unlock()
	if first {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

func (t *popTimers) cancel(e *popEntry) {
	t.mu.Lock()
	if e.hidx >= 0 {
		heap.Remove(&t.h, e.hidx)
	}
	t.mu.Unlock()
}

// arm records and returns the deadline the expiry loop sleeps until: the heap's earliest (0:
// none).
func (t *popTimers) arm() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armed = 0
	if len(t.h) > 0 {
		t.armed = t.h[0].hdeadline
	}
	return t.armed
}

// scheduled reports whether e is in the heap (hidx belongs to the heap's lock).
func (t *popTimers) scheduled(e *popEntry) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return e.hidx >= 0
}

// due removes and returns the entries whose deadline is at or before now (at most max), and
// the next deadline (0: none).
func (t *popTimers) due(now int64, max int) (out []*popEntry, next int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.h) > 0 && t.h[0].hdeadline <= now && len(out) < max {
		out = append(out, heap.Pop(&t.h).(*popEntry))
	}
	if len(t.h) > 0 {
		next = t.h[0].hdeadline
	}
	return out, next
}

// popWaiters wakes receives parked on a topic: a channel per topic, closed by the next
// arrival (or expiry, or FIFO release) on it.
type popWaiters struct {
	n  atomic.Int32 // receives waiting, so that the dispatcher's hook costs one load when none
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (w *popWaiters) wait(topic string) chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.ch[topic]
	if c == nil {
		c = make(chan struct{})
		w.ch[topic] = c
	}
	return c
}

func (w *popWaiters) wake(topic string) {
	if w.n.Load() == 0 {
		return
	}
	w.mu.Lock()
	if c := w.ch[topic]; c != nil {
		close(c)
		delete(w.ch, topic)
	}
	w.mu.Unlock()
}

func msNow(now time.Time) int64 { return now.UnixMilli() }
