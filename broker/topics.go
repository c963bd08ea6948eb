package broker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
type topicTable struct {
	path string

	mu     sync.RWMutex
	topics map[string]TopicConfig
}

func openTopicTable(path string) (*topicTable, error) {
	t := &topicTable{path: path, topics: map[string]TopicConfig{}}
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

// put creates or replaces a topic and persists the table. created reports whether the topic
// is new.
func (t *topicTable) put(tc TopicConfig) (created bool, err error) {
	if err := tc.validate(); err != nil {
		return false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old, existed := t.topics[tc.Name]
	if existed && old == tc {
		return false, nil
	}
	t.topics[tc.Name] = tc
	if err := t.persistLocked(); err != nil {
		if existed {
			t.topics[tc.Name] = old
		} else {
			delete(t.topics, tc.Name)
		}
		return false, err
	}
	return !existed, nil
}

// createIfAbsent creates tc unless a topic of that name exists, and returns the one in force.
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
	t.topics[tc.Name] = tc
	if err := t.persistLocked(); err != nil {
		delete(t.topics, tc.Name)
		return TopicConfig{}, false, err
	}
	return tc, true, nil
}

func (t *topicTable) remove(name string) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.topics[name]
	if !ok {
		return false, nil
	}
	delete(t.topics, name)
	if err := t.persistLocked(); err != nil {
		t.topics[name] = old
		return false, err
	}
	return true, nil
}

func (t *topicTable) persistLocked() error {
	file := struct {
		Topics map[string]TopicConfig `json:"topicConfigTable"`
	}{t.topics}
	b, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		return fmt.Errorf("encode topics: %w", err)
	}
	return writeFileAtomic(t.path, b)
}

// writeFileAtomic replaces path with data so that a crash leaves either the old or the new
// content, never a mix: write a temporary file, fsync it, rename it over, fsync the directory.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
