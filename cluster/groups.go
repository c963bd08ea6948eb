package cluster

import (
	"context"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

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
					m.reconcileGroups(ctx, shared)
					close(synced)
				}
				continue
			}
			m.applyGroup(e)
		case <-m.groupsNow:
			if loaded {
				shared = m.catchUpGroups(ctx, shared)
			}
		case e := <-local:
			if !loaded {
				continue // reconcileGroups, once loaded, covers it
			}
			if shared = m.catchUpGroups(ctx, shared); !shared {
				continue // a replica: its table is the master's copy
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
	name, rec, put, ok := m.groups.apply(m, e)
	switch {
	case !ok:
	case put:
		m.materialiseGroup(rec.Config)
	default:
		// Offsets stay: they are this broker's queues' (an idle group's are swept later).
		if err := m.b.DeleteGroup(name, false); err != nil && !errors.Is(err, broker.ErrNotFound) {
			m.log.Error("cluster groups: delete the local copy of a group deleted in the cluster", "group", name, "err", err)
		}
	}
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
// by the table's rules (table.publish).
func (m *Member) publishGroup(ctx context.Context, name string, update bool) {
	if g, ok := m.b.Group(name); ok && sharedGroup(name) {
		m.groups.publish(ctx, m, name, g, update, m.materialiseGroup)
	}
}

// unpublishGroup deletes a group the broker deleted (DELETE_SUBSCRIPTIONGROUP, or the idle
// sweep) from the bucket, so that every broker deletes its copy. A broker whose consumers of
// the group are still live creates it again at their next heartbeat, which shares it again.
func (m *Member) unpublishGroup(ctx context.Context, name string) { m.groups.unpublish(ctx, m, name) }

// reconcileGroups runs once the bucket is loaded: the broker's groups the cluster does not
// know are published, then every group of the cluster is materialised, the cluster's copy
// winning. A replica set's replica (share false) publishes nothing: it materialises only.
func (m *Member) reconcileGroups(ctx context.Context, share bool) {
	for _, gs := range m.b.Groups() {
		if share && gs.Configured {
			m.publishGroup(ctx, gs.Name, false)
		}
	}
	for _, g := range m.groups.configs(m) {
		m.materialiseGroup(g)
	}
}

// catchUpGroups is catchUpTopics for subscription groups.
func (m *Member) catchUpGroups(ctx context.Context, shared bool) bool {
	now := m.sharing()
	if now && !shared {
		m.reconcileGroups(ctx, true)
	}
	return now
}
