package cluster

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

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
	// shared: the broker's own were reconciled with the cluster's as a sharing member
	// (a replica set's node shares only once master, and reconciles then).
	loaded, shared := false, false
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
					loaded, shared = true, m.sharing()
					m.reconcile(ctx, shared)
					close(synced)
				}
				continue
			}
			m.applyTopic(e)
		case <-m.topicsNow:
			if loaded {
				shared = m.catchUpTopics(ctx, shared)
			}
		case e := <-local:
			if !loaded {
				continue // reconcile, once loaded, covers it
			}
			if shared = m.catchUpTopics(ctx, shared); !shared {
				continue // a replica: its table is the master's copy
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
	name, rec, put, ok := m.topics.apply(m, e)
	switch {
	case !ok:
	case put:
		m.materialise(rec.Config)
	default:
		if _, ok := m.b.Topic(name); ok {
			if err := m.b.DeleteTopic(name); err != nil && !errors.Is(err, broker.ErrNotFound) {
				m.log.Error("cluster topics: delete the local copy of a topic deleted in the cluster", "topic", name, "err", err)
			}
		}
	}
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

// publishTopic writes a topic the broker created (or, with update, changed) to the bucket,
// by the table's rules (table.publish).
func (m *Member) publishTopic(ctx context.Context, name string, update bool) {
	if tc, ok := m.b.Topic(name); ok && shared(name) {
		m.topics.publish(ctx, m, name, tc, update, m.materialise)
	}
}

// unpublishTopic deletes a topic the broker deleted from the bucket, so that every broker
// deletes its copy.
func (m *Member) unpublishTopic(ctx context.Context, name string) { m.topics.unpublish(ctx, m, name) }

// reconcile runs once the bucket is loaded: the broker's shared topics the cluster does not
// know are published (a node never drops queues, and their messages, because it was away),
// then every topic of the cluster is materialised, the cluster's copy winning. A replica
// set's replica (share false) publishes nothing: it materialises only.
func (m *Member) reconcile(ctx context.Context, share bool) {
	for _, tc := range m.b.Topics() {
		if share {
			m.publishTopic(ctx, tc.Name, false)
		}
	}
	for _, tc := range m.topics.configs(m) {
		m.materialise(tc)
	}
}

// catchUpTopics is a replica set's node's turn to share: once master (sharing), the broker's
// topics the cluster does not know are published and the cluster's materialised, as at a
// join. It returns whether the member shares now.
func (m *Member) catchUpTopics(ctx context.Context, shared bool) bool {
	now := m.sharing()
	if now && !shared {
		m.reconcile(ctx, true)
	}
	return now
}
