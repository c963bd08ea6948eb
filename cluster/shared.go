package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/flowd-io/flowd/broker"
)

// Record is an entry of a bucket of shared configurations: the configuration every broker of
// the cluster materialises, who wrote it first and who last changed it (Updater empty,
// Updated zero, while it was never updated).
type Record[C comparable] struct {
	Config  C         `json:"config"`
	Creator string    `json:"creator"`
	Created time.Time `json:"created"`
	Updater string    `json:"updater,omitempty"`
	Updated time.Time `json:"updated"`
}

// TopicRecord is a topic's entry in the topics bucket (each broker gets Config's queue
// counts).
type TopicRecord = Record[broker.TopicConfig]

// GroupRecord is a subscription group's entry in the groups bucket.
type GroupRecord = Record[broker.GroupConfig]

// table is the watched copy of one bucket of shared configurations (topics or groups) and
// the rules both follow: a creation is written with Create, so of two brokers creating one
// name the first wins and the second adopts its configuration; an update is written with
// compare-and-set on the revision this member last saw, so the last update the bucket
// accepted holds on every broker; an entry no newer than the copy's (the echo of this
// member's own write) is not applied. recs and revs are guarded by Member.mu.
type table[C comparable] struct {
	what   string             // "topic" or "group": the log attribute and wording
	nameOf func(C) string     // the configuration's name, which must match its key
	kv     jetstream.KeyValue // set once by the goroutine that joins
	recs   map[string]Record[C]
	revs   map[string]uint64
}

func newTable[C comparable](what string, nameOf func(C) string) table[C] {
	return table[C]{what: what, nameOf: nameOf, recs: map[string]Record[C]{}, revs: map[string]uint64{}}
}

// configs returns the configurations of the watched copy.
func (t *table[C]) configs(m *Member) []C {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]C, 0, len(t.recs))
	for _, rec := range t.recs {
		out = append(out, rec.Config)
	}
	return out
}

// apply takes one change of the bucket into the watched copy. It returns the entry's name,
// and the record when it was put (put false: deleted); ok false when there is nothing for
// the broker to do (a stale echo, a key or entry that is not flowd's).
func (t *table[C]) apply(m *Member, e jetstream.KeyValueEntry) (name string, rec Record[C], put, ok bool) {
	name, err := decodeKey(e.Key())
	if err != nil {
		m.log.Warn("cluster "+t.what+"s: ignoring a key", "err", err)
		return "", rec, false, false
	}
	m.mu.Lock()
	stale := e.Revision() <= t.revs[name]
	m.mu.Unlock()
	if stale {
		// The echo of a write this member made (its copy and the broker hold it, or a later
		// local change) or has followed with another: applying it would undo what followed.
		return "", rec, false, false
	}
	if e.Operation() != jetstream.KeyValuePut {
		m.mu.Lock()
		delete(t.recs, name)
		delete(t.revs, name)
		m.mu.Unlock()
		return name, rec, false, true
	}
	if err := json.Unmarshal(e.Value(), &rec); err != nil || t.nameOf(rec.Config) != name {
		m.log.Warn("cluster "+t.what+"s: ignoring a malformed entry", "key", e.Key(), "err", err)
		return "", rec, false, false
	}
	m.mu.Lock()
	t.recs[name], t.revs[name] = rec, e.Revision()
	m.mu.Unlock()
	return name, rec, true, true
}

// publish writes cur, the broker's configuration of name, which it created (or, with update,
// changed), to the bucket. When the cluster's copy came first, materialise gives it to the
// broker instead.
func (t *table[C]) publish(ctx context.Context, m *Member, name string, cur C, update bool, materialise func(C)) {
	m.mu.RLock()
	rec, known := t.recs[name]
	rev := t.revs[name]
	m.mu.RUnlock()
	if known && rec.Config == cur {
		return // the broker holds the cluster's copy (most often: this member put it there)
	}
	if known && !update {
		materialise(rec.Config) // the cluster's copy came first
		return
	}
	now := time.Now()
	if !known {
		rec = Record[C]{Creator: m.name, Created: now}
	} else {
		rec.Updater, rec.Updated = m.name, now
	}
	rec.Config = cur
	data, err := json.Marshal(rec)
	if err != nil {
		m.log.Error("cluster "+t.what+"s: encode", t.what, name, "err", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if known {
		rev, err = t.kv.Update(cctx, encodeKey(name), data, rev)
	} else {
		rev, err = t.kv.Create(cctx, encodeKey(name), data)
	}
	switch {
	case err == nil:
		m.mu.Lock()
		if rev > t.revs[name] {
			t.recs[name], t.revs[name] = rec, rev
		}
		m.mu.Unlock()
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		// Another broker wrote it first; the watch brings its configuration, which
		// replaces this broker's.
		m.log.Info("cluster "+t.what+"s: written concurrently elsewhere, adopting the cluster's copy", t.what, name, "update", update)
	default:
		m.log.Error("cluster "+t.what+"s: publish; it stays on this broker only until it is written again", t.what, name, "update", update, "err", err)
	}
}

// unpublish deletes name, which the broker deleted, from the bucket, so that every broker
// deletes its copy.
func (t *table[C]) unpublish(ctx context.Context, m *Member, name string) {
	m.mu.RLock()
	_, known := t.recs[name]
	m.mu.RUnlock()
	if !known {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, m.opts.RequestTimeout)
	defer cancel()
	if err := t.kv.Delete(cctx, encodeKey(name)); err != nil {
		m.log.Error("cluster "+t.what+"s: delete in the cluster", t.what, name, "err", err)
	}
}
