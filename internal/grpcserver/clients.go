package grpcserver

import (
	"slices"
	"sync"
	"time"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// session is one client's Telemetry stream: what its settings said, and the stream the
// server writes commands to (a transaction check-back).
type session struct {
	clientID string
	typ      pb.ClientType
	group    string   // a consumer's group
	topics   []string // a producer's topics
	lastSeen time.Time

	sendMu sync.Mutex // a gRPC stream takes one writer at a time
	send   func(*pb.TelemetryCommand) error
	done   chan struct{} // closed to end the stream (Shutdown)
}

func (s *session) write(c *pb.TelemetryCommand) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.send(c)
}

// clientTable holds the Telemetry sessions, and the clients known only by heartbeats. A
// client may hold several sessions (one per endpoint it knows this server by), so sessions
// are kept by themselves, not by client id. Its lock is a leaf.
type clientTable struct {
	mu       sync.Mutex
	sessions map[*session]struct{}
	beats    map[string]time.Time // client id → last heartbeat
}

func newClientTable() *clientTable {
	return &clientTable{sessions: map[*session]struct{}{}, beats: map[string]time.Time{}}
}

// clientExpiry is how long a heartbeat keeps a client without a session counted: the
// clients heartbeat every 10 s.
const clientExpiry = 45 * time.Second

func (t *clientTable) put(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sessions[s] = struct{}{}
}

func (t *clientTable) remove(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sessions, s)
}

func (t *clientTable) beat(id string, now time.Time) {
	if id == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for s := range t.sessions {
		if s.clientID == id {
			s.lastSeen = now
		}
	}
	t.beats[id] = now
	for k, at := range t.beats {
		if now.Sub(at) > clientExpiry {
			delete(t.beats, k)
		}
	}
}

// terminated forgets a client that said it stops (NotifyClientTermination).
func (t *clientTable) terminated(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.beats, id)
}

// len counts distinct clients: by session or by a heartbeat within clientExpiry.
func (t *clientTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make(map[string]struct{}, len(t.sessions)+len(t.beats))
	for s := range t.sessions {
		ids[s.clientID] = struct{}{}
	}
	for id := range t.beats {
		ids[id] = struct{}{}
	}
	return len(ids)
}

// producerFor is the most recently seen producer session that publishes topic, else any
// producer session (a transactional producer may not list its topics), or nil.
func (t *clientTable) producerFor(topic string) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	var best, anyone *session
	for s := range t.sessions {
		if s.typ != pb.ClientType_PRODUCER {
			continue
		}
		if slices.Contains(s.topics, topic) && (best == nil || s.lastSeen.After(best.lastSeen)) {
			best = s
		}
		if anyone == nil || s.lastSeen.After(anyone.lastSeen) {
			anyone = s
		}
	}
	if best != nil {
		return best
	}
	return anyone
}

func (t *clientTable) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for s := range t.sessions {
		closeOnce(s.done)
	}
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}
