package broker

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
)

// rebalanceWatch turns changes of a group's queue locks into GroupRebalanced events.
//
// # Notes
//
// A rebalance is many lock and unlock requests from several members. Each one (re)starts the
// group's settle timer; when it fires, the group's current lock table is the new assignment,
// and it is reported only if it differs from the last one reported, so lease renewals cost
// nothing. The lock table is what flowd's consumers agree on (they allocate from it), which
// is why the event is derived from it rather than from membership.
type rebalanceWatch struct {
	settle time.Duration
	// allocation returns a group's current lock holders; the broker passes its lock table.
	allocation func(group string) map[protocol.MessageQueue]string
	emit       func(Event)

	mu     sync.Mutex
	timers map[string]*time.Timer
	last   map[string]map[string][]protocol.MessageQueue
	closed bool
}

func newRebalanceWatch(settle time.Duration, allocation func(string) map[protocol.MessageQueue]string, emit func(Event)) *rebalanceWatch {
	return &rebalanceWatch{settle: settle, allocation: allocation, emit: emit, timers: map[string]*time.Timer{}, last: map[string]map[string][]protocol.MessageQueue{}}
}

// changed notes that group's locks may have changed.
func (w *rebalanceWatch) changed(group string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	if t, ok := w.timers[group]; ok {
		t.Reset(w.settle)
		return
	}
	w.timers[group] = time.AfterFunc(w.settle, func() { w.report(group) })
}

// report emits the group's assignment if it is new. The timer stays in the map (stopped)
// until the group is forgotten, so that a burst of changes reuses it.
func (w *rebalanceWatch) report(group string) {
	byMember := map[string][]protocol.MessageQueue{}
	for mq, client := range w.allocation(group) {
		byMember[client] = append(byMember[client], mq)
	}
	for _, mqs := range byMember {
		slices.SortFunc(mqs, protocol.MessageQueue.Compare)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || maps.EqualFunc(w.last[group], byMember, slices.Equal) {
		return
	}
	if len(byMember) == 0 && w.last[group] == nil {
		return // never held anything: nothing to report
	}
	w.last[group] = byMember
	// Emitted under w.mu, so that two reports of one group cannot reach the bus out of order.
	w.emit(Event{Type: GroupRebalanced, Time: time.Now(), Group: group, Allocation: byMember})
}

// forget drops a group's state (an idle group swept away).
func (w *rebalanceWatch) forget(group string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t, ok := w.timers[group]; ok {
		t.Stop()
		delete(w.timers, group)
	}
	delete(w.last, group)
}

// close stops every timer; no event is emitted after it returns.
func (w *rebalanceWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for _, t := range w.timers {
		t.Stop()
	}
}
