package broker

import "container/heap"

// reschedule moves e, which may be on the heap, to deadline. The deadline is written under
// the timers' lock: while e is on the heap, due and the heap's ordering read it under that
// lock alone (a change of invisibility raced with the expiry loop before).
func (t *popTimers) reschedule(e *popEntry, deadline int64) {
	t.mu.Lock()
	e.deadline = deadline
	if e.hidx >= 0 {
		heap.Fix(&t.h, e.hidx)
	} else {
		heap.Push(&t.h, e)
	}
	first := t.h[0] == e
	t.mu.Unlock()
	if first {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}
