package broker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flowd-io/flowd/protocol"
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
	// GroupDeleted: a group's entry went: an idle group was forgotten (see
	// Config.GroupRetention), or DeleteGroup (DELETE_SUBSCRIPTIONGROUP) removed it.
	GroupDeleted
	// GroupRebalanced: a group's assignment, as its members' queue locks show it, settled on
	// a new value (Allocation). Consumers that do not lock queues (RocketMQ push consumers)
	// do not show here.
	GroupRebalanced
	// OffsetReset: an operator moved a group's offsets of a topic (ResetOffsets,
	// ResetOffsetsTo); Offsets holds the new offset of each queue. The commits themselves are
	// OffsetCommitted events before it.
	OffsetReset
	// StoreFailed: the store stopped accepting writes (disk full, a failed flush); Reason
	// says why. The broker keeps serving reads.
	StoreFailed
	// TransactionDiscarded: a transactional half message got no outcome from its producer
	// group within Config.TransactionCheckMax check-backs (or could no longer be read) and
	// was dropped. Topic and QueueID are its real ones, Group its producer group, Offset its
	// offset in the half topic, Reason why.
	TransactionDiscarded
	// AllocatorMismatch: the members of a group that report their allocation strategy
	// (flowd consumers) started reporting different ones, the set of different ones changed,
	// or they agree again (Reason "agreed"). Allocators holds each reporting member's
	// strategy identity. It comes once per change, not per heartbeat. While members
	// disagree, flowd consumers all allocate with the built-in averagely strategy.
	AllocatorMismatch
	// TopicUpdated: an existing topic's configuration changed (UpdateTopic, PutTopic,
	// UPDATE_AND_CREATE_TOPIC on a topic that exists); Queues is its new write queue count.
	// A put that changes nothing emits nothing.
	TopicUpdated
	// GroupUpdated: an existing subscription group's settings changed (PutGroup,
	// UPDATE_AND_CREATE_SUBSCRIPTIONGROUP). A put that changes nothing emits nothing.
	GroupUpdated
	// PopDeadLettered: a message handed out to a pop group went to the group's dead-letter
	// topic (%DLQ%<group>), after its last delivery expired or on request (PopToDLQ). Topic,
	// QueueID and Offset name the message, Group the group, Reason how many deliveries it had.
	PopDeadLettered
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
	case GroupDeleted:
		return "group.deleted"
	case GroupRebalanced:
		return "group.rebalanced"
	case OffsetReset:
		return "offset.reset"
	case StoreFailed:
		return "store.failed"
	case TransactionDiscarded:
		return "transaction.discarded"
	case AllocatorMismatch:
		return "group.allocator_mismatch"
	case TopicUpdated:
		return "topic.updated"
	case GroupUpdated:
		return "group.updated"
	case PopDeadLettered:
		return "pop.dead_lettered"
	}
	return "event." + strconv.Itoa(int(t))
}

// Event is one control-plane fact. Fields that do not apply to a type are zero.
type Event struct {
	// Seq numbers the broker's events from 1, without gaps, in the order the state changed:
	// of two commits of one queue, the one applied last has the higher Seq. A subscriber
	// that sees a gap lost events (its queue was full; see Broker.EventsDropped).
	Seq  uint64
	Type EventType
	Time time.Time
	// Cluster and Broker name the node (Config.Cluster, Config.BrokerName), so that events
	// of several brokers can share one subject space.
	Cluster string
	Broker  string

	Topic    string
	Group    string
	ClientID string
	QueueID  int32
	Offset   int64
	// Reason says why a member left: "unregister", "connection closed", "expired"; or why
	// a transaction was discarded.
	Reason string
	// Queues is the topic's (write) queue count for TopicCreated and TopicUpdated.
	Queues int
	// Allocation is a GroupRebalanced group's assignment: each member's client id and the
	// queues it holds, sorted.
	Allocation map[string][]protocol.MessageQueue
	// Offsets is an OffsetReset's new offset of each queue of Topic.
	Offsets map[int32]int64
	// Allocators is an AllocatorMismatch group's members (client id) and the allocator
	// identity each reported.
	Allocators map[string]string
}

// eventBus numbers broker events and hands them to subscribers.
//
// # Notes
//
// emit never blocks and never runs a subscriber: each subscriber has a bounded queue and a
// goroutine of its own, and an event that finds the queue full is dropped and counted. So a
// slow subscriber costs the pull and commit paths nothing, and a subscriber may call
// anything of the broker, its own cancel included, without deadlocking.
//
// Tables whose events must come out in the order of their state changes (offsets, members,
// groups, and the rebalance watch) call emit while they hold their own lock: the bus's lock
// is a leaf below every table lock, so Seq order is the order of the changes.
type eventBus struct {
	cluster, broker string
	queueSize       int

	mu     sync.Mutex
	seq    uint64
	subs   []*subscriber // replaced, never modified, so emit iterates without copying
	closed bool

	dropped atomic.Uint64
}

type subscriber struct {
	fn     func(Event)
	ch     chan Event    // closed by the bus's close: deliver what is queued, then exit
	done   chan struct{} // closed by cancel: exit now
	once   sync.Once
	exited chan struct{}
}

func newEventBus(cluster, broker string, queueSize int) *eventBus {
	return &eventBus{cluster: cluster, broker: broker, queueSize: queueSize}
}

// subscribe starts delivering events to fn on a goroutine of its own until cancel is called
// or the bus closes. cancel does not wait for a running fn, so fn may call it.
func (b *eventBus) subscribe(fn func(Event)) (cancel func()) {
	s := &subscriber{fn: fn, ch: make(chan Event, b.queueSize), done: make(chan struct{}), exited: make(chan struct{})}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return func() {}
	}
	b.subs = append(b.subs[:len(b.subs):len(b.subs)], s)
	b.mu.Unlock()
	go s.run()
	return func() {
		b.mu.Lock()
		for i, x := range b.subs {
			if x == s {
				subs := make([]*subscriber, 0, len(b.subs)-1)
				b.subs = append(append(subs, b.subs[:i]...), b.subs[i+1:]...)
				break
			}
		}
		b.mu.Unlock()
		s.stop()
	}
}

func (s *subscriber) stop() { s.once.Do(func() { close(s.done) }) }

func (s *subscriber) run() {
	defer close(s.exited)
	for {
		select {
		case <-s.done:
			return
		case e, ok := <-s.ch:
			if !ok {
				return // the bus closed and everything queued was delivered
			}
			select {
			case <-s.done: // cancelled while the event waited
				return
			default:
			}
			s.fn(e)
		}
	}
}

// emit numbers e and queues it for every subscriber. It never blocks.
func (b *eventBus) emit(e Event) {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Cluster, e.Broker = b.cluster, b.broker
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e.Seq = b.seq
	for _, s := range b.subs {
		select {
		case s.ch <- e:
		default:
			b.dropped.Add(1)
		}
	}
}

// close delivers what each subscriber has queued (the broker's last events: members
// leaving as connections close) and stops them; later events reach no one. A subscriber still
// busy when ctx ends is cancelled, so a stuck one cannot hold up the shutdown.
func (b *eventBus) close(ctx context.Context) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	subs := b.subs
	b.subs, b.closed = nil, true
	b.mu.Unlock()
	for _, s := range subs {
		close(s.ch) // emit no longer sees s: nothing sends on it again
	}
	for _, s := range subs {
		select {
		case <-s.exited:
		case <-ctx.Done():
			s.stop()
		}
	}
}

// lastSeq is the Seq of the latest event.
func (b *eventBus) lastSeq() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.seq
}
