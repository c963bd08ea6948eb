package broker

import (
	"strconv"
	"sync"
	"time"
)

// EventType says what happened in an Event.
type EventType int

// Event types. A publisher (the NATS control plane) maps each to a subject.
const (
	TopicCreated EventType = iota + 1
	TopicDeleted
	MemberJoined
	MemberLeft
	OffsetCommitted
	GroupCreated
)

func (t EventType) String() string {
	switch t {
	case TopicCreated:
		return "topic.created"
	case TopicDeleted:
		return "topic.deleted"
	case MemberJoined:
		return "member.joined"
	case MemberLeft:
		return "member.left"
	case OffsetCommitted:
		return "offset.committed"
	case GroupCreated:
		return "group.created"
	}
	return "event." + strconv.Itoa(int(t))
}

// Event is one control-plane fact. Fields that do not apply to a type are zero.
type Event struct {
	Type     EventType
	Time     time.Time
	Topic    string
	Group    string
	ClientID string
	QueueID  int32
	Offset   int64
	// Reason says why a member left: "unregister", "connection closed", "expired".
	Reason string
	// Queues is the topic's queue count for TopicCreated.
	Queues int
}

// eventBus fans broker events out to subscribers. Subscribers are called synchronously on
// the goroutine that raised the event, outside every broker lock, so they must not block:
// a publisher hands the event to its own queue.
type eventBus struct {
	mu   sync.RWMutex
	next int
	subs map[int]func(Event)
}

func (b *eventBus) subscribe(fn func(Event)) (cancel func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.subs == nil {
		b.subs = map[int]func(Event){}
	}
	id := b.next
	b.next++
	b.subs[id] = fn
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.subs, id)
	}
}

func (b *eventBus) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, fn := range b.subs {
		fn(e)
	}
}
