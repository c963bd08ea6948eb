package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sync"
)

// groupNameRE is RocketMQ's group charset. The length limit is not RocketMQ's 255 but 120, so
// that the group's retry topic "%RETRY%<group>" is still a valid (127-character) topic name:
// a longer group would be accepted and then fail every heartbeat.
var groupNameRE = regexp.MustCompile(`^[A-Za-z0-9_%|-]{1,120}$`)

// ValidateGroup checks a consumer group name: 1 to 120 characters from [A-Za-z0-9_%|-].
// Group names become part of topic names (%RETRY%<group>) and of the keys of the persisted
// offset and group tables, so anything else is refused.
func ValidateGroup(name string) error {
	if !groupNameRE.MatchString(name) {
		return fmt.Errorf("bad consumer group: %q must be 1-120 characters of [A-Za-z0-9_%%|-]", name)
	}
	return nil
}

// GroupConfig is a subscription group's settings, RocketMQ's SubscriptionGroupConfig.
type GroupConfig struct {
	Name           string `json:"groupName"`
	ConsumeEnable  bool   `json:"consumeEnable"`
	RetryQueueNums int    `json:"retryQueueNums"`
	RetryMaxTimes  int    `json:"retryMaxTimes"`
}

// groupTable holds the subscription groups and persists them.
type groupTable struct {
	path string

	mu     sync.RWMutex
	groups map[string]GroupConfig
}

func openGroupTable(path string) (*groupTable, error) {
	t := &groupTable{path: path, groups: map[string]GroupConfig{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read subscription groups %s: %w", path, err)
	}
	var file struct {
		Groups map[string]GroupConfig `json:"subscriptionGroupTable"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		return nil, fmt.Errorf("parse subscription groups %s: %w", path, err)
	}
	for k, v := range file.Groups {
		t.groups[k] = v
	}
	return t, nil
}

func (t *groupTable) get(name string) (GroupConfig, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	g, ok := t.groups[name]
	return g, ok
}

// createIfAbsent returns the group's config, creating it when absent.
func (t *groupTable) createIfAbsent(g GroupConfig) (GroupConfig, bool, error) {
	if cur, ok := t.get(g.Name); ok {
		return cur, false, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.groups[g.Name]; ok {
		return cur, false, nil
	}
	t.groups[g.Name] = g
	file := struct {
		Groups map[string]GroupConfig `json:"subscriptionGroupTable"`
	}{t.groups}
	b, err := json.MarshalIndent(file, "", "  ")
	if err == nil {
		err = writeFileAtomic(t.path, b)
	}
	if err != nil {
		delete(t.groups, g.Name)
		return GroupConfig{}, false, fmt.Errorf("create subscription group %q: %w", g.Name, err)
	}
	return g, true, nil
}
