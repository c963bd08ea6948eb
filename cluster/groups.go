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

// GroupRecord is a subscription group's entry in the groups bucket: the settings every broker
// of the cluster materialises, who wrote it first and who last changed it (Updater empty,
// Updated zero, while it was never updated).
type GroupRecord struct {
	Config  broker.GroupConfig `json:"config"`
	Creator string             `json:"creator"`
	Created time.Time          `json:"created"`
	Updater string             `json:"updater,omitempty"`
	Updated time.Time          `json:"updated"`
}

// sharedGroup reports whether a group belongs in the cluster's group table: the broker's own
// groups (the delay service's "%SCHEDULE%", any "%"-prefixed name) and the stateless reader
// group are each broker's business.
func sharedGroup(name string) bool {
	return !strings.HasPrefix(name, "%") && name != protocol.ReaderGroup
}

// syncGroups is the one goroutine that changes subscription groups on either side, as
// syncTopics is for topics: it applies the bucket's changes to the broker and publishes the
// broker's own creations (administrative or by a consumer's first heartbeat), updates and
// deletions. synced is closed once the bucket is loaded and the broker reconciled with it.
func (m *Member) syncGroups(ctx context.Context, w jetstream.KeyWatcher, local <-chan broker.Event, synced chan<- struct{}) {
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
					m.reconcileGroups(ctx)
					close(synced)
				}
				continue
			}
			m.applyGroup(e)
		case e := <-local:
			if !loaded {
				continue // reconcileGroups, once loaded, covers it
			}
			switch e.Type {
			case broker.GroupCreated:
				m.publishGroup(ctx, e.Group, false)
			case broker.GroupUpdated:
				m.publishGroup(ctx, e.Group, true)
			case broker.GroupDeleted:
				m.unpublishGroup(ctx, e.Group)
			}
		}
	}
}

// applyGroup applies one change of the bucket to the watched copy and to the broker.
func (m *Member) applyGroup(e jetstream.KeyValueEntry) {
	name, err := decodeKey(e.Key())
	if err != nil {
		m.log.Warn("cluster groups: ignoring a key", "err", err)
		return
	}
	m.mu.Lock()
	stale := e.Revision() <= m.groupRevs[name]
	m.mu.Unlock()
	if stale {
		// The echo of a write this member made (its copy and the broker hold it, or a later
		// local change) or has followed with another: applying it would undo what followed.
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		m.mu.Lock()
		delete(m.groups, name)
		delete(m.groupRevs, name)
		m.mu.Unlock()
		// Offsets stay: they are this broker's queues' (an idle group's are swept later).
		if err := m.b.DeleteGroup(name, false); err != nil && !errors.Is(err, broker.ErrNotFound) {
			m.log.Error("cluster groups: delete the local copy of a group deleted in the cluster", "group", name, "err", err)
		}
		return
	}
	var rec GroupRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Config.Name != name {
		m.log.Warn("cluster groups: ignoring a malformed entry", "key", e.Key(), "err", err)
		return
	}
	m.mu.Lock()
	m.groups[name] = rec
	m.groupRevs[name] = e.Revision()
	m.mu.Unlock()
	m.materialiseGroup(rec.Config)
}

// materialiseGroup gives the broker the group's shared settings.
func (m *Member) materialiseGroup(g broker.GroupConfig) {
	if cur, ok := m.b.Group(g.Name); ok && cur == g {
		return
	}
	if _, err := m.b.PutGroup(g); err != nil {
		m.log.Error("cluster groups: materialise a group of the cluster", "group", g.Name, "err", err)
	}
}

// publishGroup writes a group the broker created (or, with update, changed) to the bucket,
// by the rules of publishTopic: the first creation wins, and an update is compare-and-set on
// the revision this member last saw, so the last update the bucket accepted holds everywhere.
func (m *Member) publishGroup(ctx context.Context, name string, update bool) {
	g, ok := m.b.Group(name)
	if !ok || !sharedGroup(name) {
		return
	}
	m.mu.RLock()
	rec, known := m.groups[name]
	rev := m.groupRevs[name]
	m.mu.RUnlock()
	if known && rec.Config == g {
		return // the broker holds the cluster's copy (most often: this member put it there)
	}
	if known && !update {
		m.materialiseGroup(rec.Config) // the cluster's copy came first
		return
	}
	now := time.Now()
	if !known {
		rec = GroupRecord{Creator: m.name, Created: now}
	} else {
		rec.Updater, rec.Updated = m.name, now
	}
	rec.Config = g
	data, err := json.Marshal(rec)
	if err != nil {
		m.log.Error("cluster groups: encode", "group", name, "err", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if known {
		rev, err = m.groupsKV.Update(cctx, encodeKey(name), data, rev)
	} else {
		rev, err = m.groupsKV.Create(cctx, encodeKey(name), data)
	}
	switch {
	case err == nil:
		m.mu.Lock()
		if rev > m.groupRevs[name] {
			m.groups[name], m.groupRevs[name] = rec, rev
		}
		m.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		m.log.Info("cluster groups: group written concurrently elsewhere, adopting those settings", "group", name, "update", update)
	default:
		m.log.Error("cluster groups: publish a group; it stays on this broker only until it is written again", "group", name, "update", update, "err", err)
	}
}

// unpublishGroup deletes a group the broker deleted (DELETE_SUBSCRIPTIONGROUP, or the idle
// sweep) from the bucket, so that every broker deletes its copy. A broker whose consumers of
// the group are still live creates it again at their next heartbeat, which shares it again.
func (m *Member) unpublishGroup(ctx context.Context, name string) {
	m.mu.RLock()
	_, known := m.groups[name]
	m.mu.RUnlock()
	if !known {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if err := m.groupsKV.Delete(cctx, encodeKey(name)); err != nil {
		m.log.Error("cluster groups: delete a group in the cluster", "group", name, "err", err)
	}
}

// reconcileGroups runs once the bucket is loaded: the broker's groups the cluster does not
// know are published, then every group of the cluster is materialised, the cluster's copy
// winning.
func (m *Member) reconcileGroups(ctx context.Context) {
	for _, gs := range m.b.Groups() {
		if gs.Configured {
			m.publishGroup(ctx, gs.Name, false)
		}
	}
	m.mu.RLock()
	recs := make([]broker.GroupConfig, 0, len(m.groups))
	for _, rec := range m.groups {
		recs = append(recs, rec.Config)
	}
	m.mu.RUnlock()
	for _, g := range recs {
		m.materialiseGroup(g)
	}
}
