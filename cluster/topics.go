package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// TopicRecord is a topic's entry in the topics bucket: the configuration every broker of the
// cluster materialises (each gets Config's queue counts), who wrote it first and who last
// changed it (Updater empty, Updated zero, while it was never updated).
type TopicRecord struct {
	Config  broker.TopicConfig `json:"config"`
	Creator string             `json:"creator"`
	Created time.Time          `json:"created"`
	Updater string             `json:"updater,omitempty"`
	Updated time.Time          `json:"updated"`
}

// shared reports whether a topic belongs in the cluster's topic table: the broker's own
// topics (auto-create key, delay levels, transactions, the cluster's reply topic) and a
// group's retry and dead-letter topics are each broker's business.
func shared(name string) bool {
	return !strings.HasPrefix(name, "%") && !strings.HasPrefix(name, "RMQ_SYS_") &&
		name != protocol.AutoCreateTopicKey && name != broker.ScheduleTopic &&
		!strings.HasSuffix(name, "_REPLY_TOPIC")
}

// syncTopics is the one goroutine that changes topics on either side: it applies the
// bucket's changes to the broker and publishes the broker's own creations and deletions,
// so that the two never race each other. synced is closed once the bucket's contents are
// loaded and the broker reconciled with them.
func (m *Member) syncTopics(ctx context.Context, w jetstream.KeyWatcher, local <-chan broker.Event, synced chan<- struct{}) {
	defer w.Stop()
	loaded := false
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if !loaded {
					loaded = true
					m.reconcile(ctx)
					close(synced)
				}
				continue
			}
			m.applyTopic(e)
		case e := <-local:
			if !loaded {
				continue // reconcile, once loaded, covers it
			}
			switch e.Type {
			case broker.TopicCreated:
				m.publishTopic(ctx, e.Topic, false)
			case broker.TopicUpdated:
				m.publishTopic(ctx, e.Topic, true)
			case broker.TopicDeleted:
				m.unpublishTopic(ctx, e.Topic)
			}
		}
	}
}

// applyTopic applies one change of the bucket to the watched copy and to the broker.
func (m *Member) applyTopic(e jetstream.KeyValueEntry) {
	name, err := decodeKey(e.Key())
	if err != nil {
		m.log.Warn("cluster topics: ignoring a key", "err", err)
		return
	}
	m.mu.Lock()
	stale := e.Revision() <= m.topicRevs[name]
	m.mu.Unlock()
	if stale {
		// The echo of a write this member made (its copy and the broker hold it, or a later
		// local change) or has followed with another: applying it would undo what followed.
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		m.mu.Lock()
		delete(m.topics, name)
		delete(m.topicRevs, name)
		m.mu.Unlock()
		if _, ok := m.b.Topic(name); ok {
			if err := m.b.DeleteTopic(name); err != nil && !errors.Is(err, broker.ErrNotFound) {
				m.log.Error("cluster topics: delete the local copy of a topic deleted in the cluster", "topic", name, "err", err)
			}
		}
		return
	}
	var rec TopicRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Config.Name != name {
		m.log.Warn("cluster topics: ignoring a malformed entry", "key", e.Key(), "err", err)
		return
	}
	m.mu.Lock()
	m.topics[name] = rec
	m.topicRevs[name] = e.Revision()
	m.mu.Unlock()
	m.materialise(rec.Config)
}

// materialise gives the broker the topic's shared configuration.
func (m *Member) materialise(tc broker.TopicConfig) {
	cur, ok := m.b.Topic(tc.Name)
	var err error
	switch {
	case !ok:
		err = m.b.CreateTopic(tc)
		if errors.Is(err, broker.ErrExists) {
			err = m.b.UpdateTopic(tc)
		}
	case cur != tc:
		err = m.b.UpdateTopic(tc)
	}
	if err != nil {
		m.log.Error("cluster topics: materialise a topic of the cluster", "topic", tc.Name, "err", err)
	}
}

// publishTopic writes a topic the broker created (or, with update, changed) to the bucket.
// A creation is written with Create: of two brokers creating one topic the first wins and
// the second adopts its configuration. An update is written with compare-and-set on the
// revision this member last saw: an update made on a stale copy loses to the one the bucket
// took first, and the broker adopts that, so the last update the bucket accepted holds on
// every broker.
func (m *Member) publishTopic(ctx context.Context, name string, update bool) {
	tc, ok := m.b.Topic(name)
	if !ok || !shared(name) {
		return
	}
	m.mu.RLock()
	rec, known := m.topics[name]
	rev := m.topicRevs[name]
	m.mu.RUnlock()
	if known && rec.Config == tc {
		return // the broker holds the cluster's copy (most often: this member put it there)
	}
	if known && !update {
		m.materialise(rec.Config) // the cluster's copy came first
		return
	}
	now := time.Now()
	if !known {
		rec = TopicRecord{Creator: m.name, Created: now}
	} else {
		rec.Updater, rec.Updated = m.name, now
	}
	rec.Config = tc
	data, err := json.Marshal(rec)
	if err != nil {
		m.log.Error("cluster topics: encode", "topic", name, "err", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if known {
		rev, err = m.topicsKV.Update(cctx, encodeKey(name), data, rev)
	} else {
		rev, err = m.topicsKV.Create(cctx, encodeKey(name), data)
	}
	switch {
	case err == nil:
		m.mu.Lock()
		if rev > m.topicRevs[name] {
			m.topics[name], m.topicRevs[name] = rec, rev
		}
		m.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		// Another broker wrote it first; the watch brings its configuration, which
		// replaces this broker's.
		m.log.Info("cluster topics: topic written concurrently elsewhere, adopting that configuration", "topic", name, "update", update)
	default:
		m.log.Error("cluster topics: publish a topic; it stays on this broker only until it is written again", "topic", name, "update", update, "err", err)
	}
}

// unpublishTopic deletes a topic the broker deleted from the bucket, so that every broker
// deletes its copy.
func (m *Member) unpublishTopic(ctx context.Context, name string) {
	m.mu.RLock()
	_, known := m.topics[name]
	m.mu.RUnlock()
	if !known {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if err := m.topicsKV.Delete(cctx, encodeKey(name)); err != nil {
		m.log.Error("cluster topics: delete a topic in the cluster", "topic", name, "err", err)
	}
}

// reconcile runs once the bucket is loaded: the broker's shared topics the cluster does not
// know are published (a node never drops queues, and their messages, because it was away),
// then every topic of the cluster is materialised, the cluster's copy winning.
func (m *Member) reconcile(ctx context.Context) {
	for _, tc := range m.b.Topics() {
		m.publishTopic(ctx, tc.Name, false)
	}
	m.mu.RLock()
	recs := make([]broker.TopicConfig, 0, len(m.topics))
	for _, rec := range m.topics {
		recs = append(recs, rec.Config)
	}
	m.mu.RUnlock()
	for _, tc := range recs {
		m.materialise(tc)
	}
}
