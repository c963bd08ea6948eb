package broker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/flowd-io/flowd/protocol"
)

// maxQueues bounds the queue count of a topic: queue ids travel as int32 and every queue
// costs a directory and file handles.
const maxQueues = 1024

// Topic name prefixes RocketMQ reserves for a group's retry and dead-letter topics.
const (
	RetryTopicPrefix = "%RETRY%"
	DLQTopicPrefix   = "%DLQ%"
	// ScheduleTopic holds delayed messages, one queue per delay level, until they are due.
	ScheduleTopic = "SCHEDULE_TOPIC_XXXX"
)

// ErrBadTopic is wrapped by every topic validation error.
var ErrBadTopic = protocol.ErrBadTopic

// ValidateTopic checks a topic name against RocketMQ's rule: 1 to 127 characters from
// [A-Za-z0-9_%|-] (protocol.ValidateTopic, which the store applies too).
func ValidateTopic(name string) error { return protocol.ValidateTopic(name) }

// TopicConfig is a topic's queue counts and permissions, RocketMQ's TopicConfig.
type TopicConfig struct {
	Name           string `json:"topicName"`
	ReadQueueNums  int    `json:"readQueueNums"`
	WriteQueueNums int    `json:"writeQueueNums"`
	Perm           int    `json:"perm"`
	TopicSysFlag   int    `json:"topicSysFlag"`
	Order          bool   `json:"order"`
}

// Readable reports whether consumers may pull from the topic.
func (t TopicConfig) Readable() bool { return t.Perm&protocol.PermRead != 0 }

// Writable reports whether producers may send to the topic.
func (t TopicConfig) Writable() bool { return t.Perm&protocol.PermWrite != 0 }

func (t TopicConfig) validate() error {
	if err := ValidateTopic(t.Name); err != nil {
		return err
	}
	if t.ReadQueueNums < 1 || t.ReadQueueNums > maxQueues || t.WriteQueueNums < 1 || t.WriteQueueNums > maxQueues {
		return fmt.Errorf("%w: %q queue counts read=%d write=%d must be within 1..%d", ErrBadTopic, t.Name, t.ReadQueueNums, t.WriteQueueNums, maxQueues)
	}
	if t.Perm&^(protocol.PermRead|protocol.PermWrite|protocol.PermInherit) != 0 {
		return fmt.Errorf("%w: %q perm %d has unknown bits", ErrBadTopic, t.Name, t.Perm)
	}
	return nil
}

// topicTable holds the topic configs and persists them to one JSON file.
//
// # Notes
//
// Topics created implicitly (the first send to a new topic, a group's retry and dead-letter
// topics) only mark the table dirty; flushIfDirty writes it on the broker's table-flush timer
// and at shutdown, so a burst of new topics costs one write, not an fsync each. A crash in
// between loses those creations; the store keeps their messages and the next send re-creates
// the topic. Explicit changes (put, remove) are written before they return: a deletion must
// be durable before the topic's messages go.
type topicTable struct {
	tableFile
	// maxInternal caps the retry and dead-letter topics (%RETRY%<group>, %DLQ%<group>),
	// which clients create by naming a group.
	maxInternal int

	mu       sync.RWMutex
	topics   map[string]TopicConfig
	internal int // topics with an internal prefix
}

func isInternalTopic(name string) bool {
	return strings.HasPrefix(name, RetryTopicPrefix) || strings.HasPrefix(name, DLQTopicPrefix)
}

func openTopicTable(path string, maxInternal int) (*topicTable, error) {
	t := &topicTable{tableFile: tableFile{path: path, what: "topics"}, maxInternal: maxInternal, topics: map[string]TopicConfig{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read topics %s: %w", path, err)
	}
	var file struct {
		Topics map[string]TopicConfig `json:"topicConfigTable"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("parse topics %s: %w", path, err)
	}
	for name, tc := range file.Topics {
		if err := tc.validate(); err != nil {
			return nil, fmt.Errorf("topics %s: %w", path, err)
		}
		t.topics[name] = tc
		if isInternalTopic(name) {
			t.internal++
		}
	}
	return t, nil
}

func (t *topicTable) get(name string) (TopicConfig, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tc, ok := t.topics[name]
	return tc, ok
}

func (t *topicTable) list() []TopicConfig {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]TopicConfig, 0, len(t.topics))
	for _, tc := range t.topics {
		out = append(out, tc)
	}
	slices.SortFunc(out, func(a, b TopicConfig) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// setLocked adds or replaces a topic, keeping the internal count and cap.
func (t *topicTable) setLocked(tc TopicConfig) error {
	_, existed := t.topics[tc.Name]
	if !existed && isInternalTopic(tc.Name) {
		if t.internal >= t.maxInternal {
			return fmt.Errorf("topic %q not created: %w: the broker holds %d retry and dead-letter topics (twice MaxGroups)", tc.Name, ErrLimit, t.maxInternal)
		}
		t.internal++
	}
	t.topics[tc.Name] = tc
	t.gen++
	return nil
}

func (t *topicTable) deleteLocked(name string) {
	if _, ok := t.topics[name]; ok && isInternalTopic(name) {
		t.internal--
	}
	delete(t.topics, name)
	t.gen++
}

// put creates or replaces a topic and writes the table before it returns. created reports
// whether the topic is new.
func (t *topicTable) put(tc TopicConfig) (created bool, err error) {
	created, _, err = t.putIf(tc, nil)
	return created, err
}

// putIf is put, but when check is not nil it is called under the table's lock with the
// topic's current config (and whether it exists) and a non-nil error it returns cancels the
// change: an administrative create or update decides on the state it replaces. updated
// reports whether an existing topic's config changed.
func (t *topicTable) putIf(tc TopicConfig, check func(old TopicConfig, existed bool) error) (created, updated bool, err error) {
	if err := tc.validate(); err != nil {
		return false, false, err
	}
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	old, existed := t.topics[tc.Name]
	if check != nil {
		if err := check(old, existed); err != nil {
			t.mu.Unlock()
			return false, false, err
		}
	}
	if existed && old == tc {
		t.mu.Unlock()
		return false, false, nil
	}
	if err := t.setLocked(tc); err != nil {
		t.mu.Unlock()
		return false, false, err
	}
	t.mu.Unlock()
	if err := t.writeLocked(); err != nil {
		t.mu.Lock()
		if cur, ok := t.topics[tc.Name]; ok && cur == tc {
			if existed {
				t.topics[tc.Name] = old
			} else {
				t.deleteLocked(tc.Name)
			}
		}
		t.mu.Unlock()
		return false, false, err
	}
	return !existed, existed, nil
}

// createIfAbsent creates tc unless a topic of that name exists, and returns the one in force.
// The creation is written by the next flushIfDirty.
func (t *topicTable) createIfAbsent(tc TopicConfig) (TopicConfig, bool, error) {
	if cur, ok := t.get(tc.Name); ok {
		return cur, false, nil
	}
	if err := tc.validate(); err != nil {
		return TopicConfig{}, false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.topics[tc.Name]; ok {
		return cur, false, nil
	}
	if err := t.setLocked(tc); err != nil {
		return TopicConfig{}, false, err
	}
	return tc, true, nil
}

// remove deletes a topic and writes the table before it returns.
func (t *topicTable) remove(name string) (bool, error) {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	old, ok := t.topics[name]
	if !ok {
		t.mu.Unlock()
		return false, nil
	}
	t.deleteLocked(name)
	t.mu.Unlock()
	if err := t.writeLocked(); err != nil {
		t.mu.Lock()
		if _, again := t.topics[name]; !again {
			t.setLocked(old) // cannot fail: the count was just lowered for it
		}
		t.mu.Unlock()
		return false, err
	}
	return true, nil
}

// flushIfDirty writes the table if an implicit creation changed it since the last write.
func (t *topicTable) flushIfDirty() error { return t.flushIfDirtyDoc(&t.mu, t.doc) }

// writeLocked writes the whole table; the caller holds flushMu (not mu).
func (t *topicTable) writeLocked() error { return t.writeDoc(&t.mu, t.doc) }

// doc is the file's content; the caller holds mu.
func (t *topicTable) doc() any {
	return struct {
		Topics map[string]TopicConfig `json:"topicConfigTable"`
	}{t.topics}
}

// topicForWrite returns the topic, creating it with n queues when it does not exist.
func (b *Broker) topicForWrite(name string, n int) (TopicConfig, error) {
	tc, created, err := b.topics.createIfAbsent(TopicConfig{Name: name, ReadQueueNums: n, WriteQueueNums: n, Perm: protocol.PermRead | protocol.PermWrite})
	if err != nil {
		return tc, fmt.Errorf("create topic %q: %w", name, err)
	}
	if created {
		b.log.Info("topic created", "topic", name, "queues", n)
		b.events.emit(Event{Type: TopicCreated, Topic: name, Queues: n})
	}
	return tc, nil
}

// internalTopic returns a group's retry or dead-letter topic, creating it with one queue.
func (b *Broker) internalTopic(name string) (TopicConfig, error) { return b.topicForWrite(name, 1) }

// isSystemTopic reports whether topic is one of the broker's own, which sends and the topic
// administration refuse (ErrReserved).
func isSystemTopic(topic string) bool {
	return topic == ScheduleTopic || topic == protocol.AutoCreateTopicKey ||
		topic == protocol.TransactionHalfTopic || topic == protocol.TransactionOpTopic
}
