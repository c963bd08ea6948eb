package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/internal/atomicfile"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// offsetTable holds the consume offsets committed by consumer groups, keyed by
// "topic@group" and queue id, and writes them to one JSON file when they change.
//
// # Notes
//
// A commit is acknowledged once it is in memory; the flush loop makes it durable within
// OffsetFlushInterval. A consumer that crashes in between re-reads at most that window's
// messages, which at-least-once delivery allows.
//
// An offset on disk must never point past the messages on disk: a consumer may commit a
// message the store has not fsynced yet (async flushing, or a sync-mode pull that ran
// before the group commit), and after a power cut the log ends before the offset, so the
// group would skip every message written again below it. Every flush therefore calls sync
// (the store's Sync) after it takes its snapshot and before it writes: the snapshot's
// offsets count only messages that were written before it, and sync makes all of them
// durable. When sync fails nothing is written. Open clamps whatever the file holds to the
// queues' max offsets (see clamp) for files written by older versions, or by hand.
type offsetTable struct {
	path string
	log  *slog.Logger
	sync func() error // makes the messages the offsets count durable; nil in table tests

	flushMu sync.Mutex // serializes flushes, so an older snapshot never overwrites a newer one

	mu      sync.Mutex
	offsets map[offsetKey]map[int32]int64
	dirty   bool
	// lastCommit is when each group last committed (or, for groups loaded from the file,
	// when the table was opened): the idle-group sweeper forgets groups by it.
	lastCommit map[string]time.Time
}

// offsetKey is a struct, not the file's "topic@group" string, so that the commit a pull
// carries does not build a string per request.
type offsetKey struct{ topic, group string }

func (k offsetKey) String() string { return k.topic + "@" + k.group }

func openOffsetTable(path string, log *slog.Logger) (*offsetTable, error) {
	t := &offsetTable{path: path, log: log, offsets: map[offsetKey]map[int32]int64{}, lastCommit: map[string]time.Time{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read consumer offsets %s: %w", path, err)
	}
	var file struct {
		Offsets map[string]map[string]int64 `json:"offsetTable"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("parse consumer offsets %s: %w", path, err)
	}
	for key, queues := range file.Offsets {
		// Topic names cannot contain '@', so the first one separates the group.
		topic, group, ok := strings.Cut(key, "@")
		if !ok {
			return nil, fmt.Errorf("consumer offsets %s: key %q is not topic@group", path, key)
		}
		m := make(map[int32]int64, len(queues))
		for q, off := range queues {
			id, err := strconv.ParseInt(q, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("consumer offsets %s: %q queue id %q: %w", path, key, q, err)
			}
			m[int32(id)] = off
		}
		t.offsets[offsetKey{topic, group}] = m
		t.lastCommit[group] = time.Now()
	}
	return t, nil
}

// commit records an offset and reports whether it changed. When it changed and events is
// not nil, the OffsetCommitted event is emitted before the lock is released, so that of two
// concurrent commits of one queue the one applied last also has the later event (emit only
// queues it: see eventBus).
func (t *offsetTable) commit(group, topic string, queueID int32, offset int64, now time.Time, events *eventBus) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastCommit[group] = now
	key := offsetKey{topic, group}
	m := t.offsets[key]
	if m == nil {
		m = map[int32]int64{}
		t.offsets[key] = m
	}
	if old, ok := m[queueID]; ok && old == offset {
		return false
	}
	m[queueID] = offset
	t.dirty = true
	if events != nil {
		events.emit(Event{Type: OffsetCommitted, Time: now, Group: group, Topic: topic, QueueID: queueID, Offset: offset})
	}
	return true
}

// query returns the committed offset, or false when the group never committed one.
func (t *offsetTable) query(group, topic string, queueID int32) (int64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	off, ok := t.offsets[offsetKey{topic, group}][queueID]
	return off, ok
}

// groupOffsets returns a copy of the group's offsets for the topic.
func (t *offsetTable) groupOffsets(group, topic string) map[int32]int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	src := t.offsets[offsetKey{topic, group}]
	out := make(map[int32]int64, len(src))
	for q, o := range src {
		out[q] = o
	}
	return out
}

// removeTopic drops every group's offsets of a deleted topic.
func (t *offsetTable) removeTopic(topic string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key := range t.offsets {
		if key.topic == topic {
			delete(t.offsets, key)
			t.dirty = true
		}
	}
}

// clamp lowers every offset above its queue's max offset to that max and reports what it
// changed. The broker calls it once the store has recovered: an offset past the end of a
// queue would make the group skip the messages later written below it.
func (t *offsetTable) clamp(maxOffset func(topic string, queueID int32) int64) []clampedOffset {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []clampedOffset
	for key, queues := range t.offsets {
		for q, off := range queues {
			if hi := maxOffset(key.topic, q); off > hi {
				queues[q] = hi
				t.dirty = true
				out = append(out, clampedOffset{key.group, key.topic, q, off, hi})
			}
		}
	}
	return out
}

// clampedOffset is one offset clamp lowered.
type clampedOffset struct {
	group, topic string
	queueID      int32
	from, to     int64
}

// removeGroup drops every offset of a group.
func (t *offsetTable) removeGroup(group string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key := range t.offsets {
		if key.group == group {
			delete(t.offsets, key)
			t.dirty = true
		}
	}
	delete(t.lastCommit, group)
}

// lastCommitOf is when group last committed; false when it has no offsets.
func (t *offsetTable) lastCommitOf(group string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.lastCommit[group]
	return at, ok
}

// groupsIdleSince returns the groups with offsets whose last commit is before deadline.
func (t *offsetTable) groupsIdleSince(deadline time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for g, at := range t.lastCommit {
		if at.Before(deadline) {
			out = append(out, g)
		}
	}
	return out
}

// flush writes the table if it changed since the last flush.
func (t *offsetTable) flush() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	if !t.dirty {
		t.mu.Unlock()
		return nil
	}
	file := struct {
		Offsets map[string]map[string]int64 `json:"offsetTable"`
	}{Offsets: make(map[string]map[string]int64, len(t.offsets))}
	for key, queues := range t.offsets {
		m := make(map[string]int64, len(queues))
		for q, off := range queues {
			m[strconv.Itoa(int(q))] = off
		}
		file.Offsets[key.String()] = m
	}
	t.dirty = false
	t.mu.Unlock()

	var err error
	if t.sync != nil {
		err = t.sync()
	}
	var b []byte
	if err == nil {
		b, err = json.Marshal(file)
	}
	if err == nil {
		err = atomicfile.WriteFile(t.path, b, 0o644)
	}
	if err != nil {
		t.mu.Lock()
		t.dirty = true
		t.mu.Unlock()
		return fmt.Errorf("flush consumer offsets: %w", err)
	}
	return nil
}

// run flushes every interval until ctx ends, then once more.
func (t *offsetTable) run(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := t.flush(); err != nil {
				t.log.Error("final offset flush failed", "err", err)
			}
			return
		case <-tick.C:
			if err := t.flush(); err != nil {
				t.log.Error("offset flush failed", "err", err)
			}
		}
	}
}

// ErrNotQueueOwner is wrapped by the error a commit gets when another client of the group
// holds the queue's lock (LOCK_BATCH_MQ).
var ErrNotQueueOwner = errors.New("queue is locked by another client of the group")

// commitOffset stores a group's consume offset and emits an event when it moved. Clients
// commit on every pull and on a timer, mostly the same offset again: only changes are events.
func (b *Broker) commitOffset(group, topic string, queueID int32, offset int64) {
	b.offsets.commit(group, topic, queueID, offset, time.Now(), b.events)
}

// commitFrom is a client's commit over connection c. While another client of the group
// holds the queue's lock, the commit is refused: a member that lost the queue (its lease ran
// out, or it was slow to notice a rebalance) would otherwise move the new owner's offset
// back and make it re-deliver. The committer holds the lock when the lock was taken on its
// connection, or when the group member registered on its connection is the lock's client;
// any other connection does not. Queues nobody locked take every commit, as in RocketMQ.
func (b *Broker) commitFrom(c *remoting.Conn, group, topic string, queueID int32, offset int64) error {
	mq := protocol.MessageQueue{Topic: topic, BrokerName: b.cfg.BrokerName, QueueID: int(queueID)}
	if holder, lockConn, ok := b.locks.holder(group, mq, time.Now()); ok && (lockConn == nil || lockConn != c) {
		if id, _ := b.consumers.clientOf(group, c); id != holder {
			if id == "" {
				id = "a connection that is no member of the group"
			}
			return fmt.Errorf("commit of offset %d for %s queue %d by %s refused: %w (%s)", offset, topic, queueID, id, ErrNotQueueOwner, holder)
		}
	}
	b.commitOffset(group, topic, queueID, offset)
	return nil
}

// commitPulled applies the commit a pull carries (its COMMIT_OFFSET flag). A refused commit
// does not fail the pull: it is logged and ignored.
func (b *Broker) commitPulled(c *remoting.Conn, group, topic string, queueID int32, offset int64) {
	if err := b.commitFrom(c, group, topic, queueID, offset); err != nil {
		b.log.Info("pull commit ignored", "group", group, "remote", c.RemoteAddr().String(), "err", err)
	}
}
