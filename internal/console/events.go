package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowd-io/flowd/control"
)

// heartbeat is how often an idle event stream sends a comment, so that proxies and the
// browser keep the connection and a dead one is noticed.
const heartbeat = 15 * time.Second

// streamEvent is the data of one Server-Sent Event: the CloudEvent's attributes and its
// data, as published on flowd.evt.<cluster>.<kind>.<event>.
type streamEvent struct {
	// Type is "<kind>.<event>", e.g. "topic.created". The stream's events carry no SSE
	// event name, so that an EventSource's onmessage receives every kind.
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Subject string          `json:"subject,omitempty"`
	Source  string          `json:"source,omitempty"`
	Time    string          `json:"time,omitempty"`
	Data    json.RawMessage `json:"data"`
}

// events streams the broker's events as Server-Sent Events until the client goes or the
// console closes. ?kinds=topic,plugin keeps the events of those kinds only.
func (s *Server) events(w http.ResponseWriter, r *http.Request, _ principal) {
	if s.cfg.Events == nil {
		noService(w)
		return
	}
	var kinds []string
	for k := range strings.SplitSeq(r.URL.Query().Get("kinds"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			kinds = append(kinds, k)
		}
	}
	prefix := control.EventSubjectPrefix + "." + s.cfg.Cluster + "."
	ch := make(chan *nats.Msg, 1024)
	sub, err := s.cfg.Events.ChanSubscribe(prefix+">", ch)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("no daemon answers: subscribe to events: %v", err))
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.cfg.Events.FlushTimeout(5 * time.Second); err != nil {
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("no daemon answers: subscribe to events: %v", err))
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx, cancel := s.shutdownContext(r.Context())
	defer cancel()
	// The server's write timeout is for ordinary replies; a stream lasts.
	_ = rc.SetWriteDeadline(time.Time{})
	if _, err := fmt.Fprint(w, "retry: 3000\n: connected\n\n"); err != nil || rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		var chunk string
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			chunk = ": heartbeat\n\n"
		case m := <-ch:
			ev := toStreamEvent(m, prefix)
			if !wanted(ev.Type, kinds) {
				continue
			}
			data, err := json.Marshal(ev)
			if err != nil {
				continue
			}
			chunk = fmt.Sprintf("id: %s\ndata: %s\n\n", ev.ID, data)
		}
		if _, err := fmt.Fprint(w, chunk); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

func toStreamEvent(m *nats.Msg, prefix string) streamEvent {
	ev := streamEvent{Type: strings.TrimPrefix(m.Subject, prefix), Data: json.RawMessage("null")}
	if json.Valid(m.Data) && len(m.Data) > 0 {
		ev.Data = m.Data
	}
	if m.Header != nil {
		ev.ID = m.Header.Get("ce-id")
		ev.Subject = m.Header.Get("ce-subject")
		ev.Source = m.Header.Get("ce-source")
		ev.Time = m.Header.Get("ce-time")
	}
	// An id or name must be one line in the stream.
	ev.ID = strings.NewReplacer("\n", "", "\r", "").Replace(ev.ID)
	ev.Type = strings.NewReplacer("\n", "", "\r", "").Replace(ev.Type)
	return ev
}

// wanted reports whether an event of type "kind.event" passes the kinds filter (empty: all).
func wanted(typ string, kinds []string) bool {
	if len(kinds) == 0 {
		return true
	}
	kind, _, _ := strings.Cut(typ, ".")
	for _, k := range kinds {
		if k == kind || k == typ {
			return true
		}
	}
	return false
}
