package broker

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/flowd-io/flowd/protocol"
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

// ErrLimit is wrapped by the error of a request that would grow a table past its configured
// cap (Config.MaxGroups).
var ErrLimit = errors.New("limit reached")

// GroupConfig is a subscription group's settings, RocketMQ's SubscriptionGroupConfig.
type GroupConfig struct {
	Name           string `json:"groupName"`
	ConsumeEnable  bool   `json:"consumeEnable"`
	RetryQueueNums int    `json:"retryQueueNums"`
	RetryMaxTimes  int    `json:"retryMaxTimes"`
	// ConsumeOrderly makes pop consumption FIFO (RocketMQ 5's consumeMessageOrderly): of
	// each message group of a queue, one message at a time is handed out (docs/pop.md).
	ConsumeOrderly bool `json:"consumeMessageOrderly"`
}

// groupTable holds the subscription groups and persists them.
//
// # Notes
//
// Groups are created by the first heartbeat or pull that names them, which may be on a hot
// path and many at once (a fleet of new consumers starting). A creation only marks the table
// dirty; flushIfDirty writes it (atomically) on the broker's table-flush timer and at
// shutdown. A crash in between loses the creation, which the next heartbeat repeats.
type groupTable struct {
	tableFile
	max int // cap on the number of groups

	mu     sync.RWMutex
	groups map[string]GroupConfig
	// active is when each group was created, loaded, or last seen with live members; the
	// idle-group sweeper forgets groups by it.
	active map[string]time.Time
}

func openGroupTable(path string, maxGroups int) (*groupTable, error) {
	t := &groupTable{tableFile: tableFile{path: path, what: "subscription groups"}, max: maxGroups, groups: map[string]GroupConfig{}, active: map[string]time.Time{}}
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
	now := time.Now()
	for k, v := range file.Groups {
		t.groups[k] = v
		t.active[k] = now
	}
	return t, nil
}

func (t *groupTable) get(name string) (GroupConfig, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	g, ok := t.groups[name]
	return g, ok
}

// createIfAbsent returns the group's config, creating it when absent and the table is below
// its cap (else an error wrapping ErrLimit). A creation is emitted as GroupCreated under the
// table's lock, and written by the next flushIfDirty.
func (t *groupTable) createIfAbsent(g GroupConfig, now time.Time, events *eventBus) (GroupConfig, bool, error) {
	if cur, ok := t.get(g.Name); ok {
		return cur, false, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur, ok := t.groups[g.Name]; ok {
		return cur, false, nil
	}
	if len(t.groups) >= t.max {
		return GroupConfig{}, false, fmt.Errorf("subscription group %q not created: %w: the broker holds MaxGroups=%d groups (idle ones are forgotten after GroupRetention)", g.Name, ErrLimit, t.max)
	}
	t.groups[g.Name] = g
	t.active[g.Name] = now
	t.gen++
	if events != nil {
		events.emit(Event{Type: GroupCreated, Time: now, Group: g.Name})
	}
	return g, true, nil
}

// remove forgets a group; the next flushIfDirty writes the table.
func (t *groupTable) remove(name string, events *eventBus) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.groups[name]; !ok {
		return false
	}
	delete(t.groups, name)
	delete(t.active, name)
	t.gen++
	if events != nil {
		events.emit(Event{Type: GroupDeleted, Group: name})
	}
	return true
}

// markActive records that the group was seen with live members at now.
func (t *groupTable) markActive(name string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.groups[name]; ok {
		t.active[name] = now
	}
}

// activity returns every group with the time it was last known active.
func (t *groupTable) activity() map[string]time.Time {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make(map[string]time.Time, len(t.active))
	for g, at := range t.active {
		out[g] = at
	}
	return out
}

// list is every group's settings, by name.
func (t *groupTable) list() []GroupConfig {
	t.mu.RLock()
	out := make([]GroupConfig, 0, len(t.groups))
	for _, g := range t.groups {
		out = append(out, g)
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b GroupConfig) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func (t *groupTable) len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.groups)
}

// flushIfDirty writes the table if it changed since the last write.
func (t *groupTable) flushIfDirty() error {
	return t.flushIfDirtyDoc(&t.mu, func() any {
		return struct {
			Groups map[string]GroupConfig `json:"subscriptionGroupTable"`
		}{t.groups}
	})
}

// ensureGroup creates a subscription group on first use, or refuses an unknown one when
// auto-creation is off or the table is at its cap (Config.MaxGroups). protocol.ReaderGroup
// is always refused: it never gets state.
func (b *Broker) ensureGroup(req *protocol.Command, group string) *protocol.Command {
	if group == protocol.ReaderGroup {
		// Pulls of stateless reads do not come here (processPull); anything else under the
		// group would give it state: membership, offsets, a retry topic.
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("consumer group %q keeps no state: it only pulls (join, commit or send back under another group)", group))
	}
	if _, ok := b.groups.get(group); ok {
		return nil
	}
	// Validate only names not in the table, so a known group costs one map lookup. Without
	// this any client could persist arbitrary (huge, control-character) group names.
	if err := ValidateGroup(group); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if b.cfg.DisableAutoCreateGroups {
		return errorResponse(req, protocol.SubscriptionGroupNotExist, fmt.Errorf("subscription group %q does not exist", group))
	}
	_, _, err := b.groups.createIfAbsent(GroupConfig{Name: group, ConsumeEnable: true, RetryQueueNums: 1, RetryMaxTimes: b.cfg.MaxReconsumeTimes}, time.Now(), b.events)
	if errors.Is(err, ErrLimit) {
		return errorResponse(req, protocol.SubscriptionGroupNotExist, err)
	}
	if err != nil {
		return errorResponse(req, protocol.SystemError, err)
	}
	return nil
}

// Group returns a subscription group's settings, if the broker keeps the group.
func (b *Broker) Group(name string) (GroupConfig, bool) { return b.groups.get(name) }

// PutGroup creates a subscription group or replaces its settings
// (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) and reports whether it was created: GroupCreated or,
// when an existing group's settings change, GroupUpdated. It fails for a bad name or
// negative retry settings, with ErrReserved for the broker's own group and ErrLimit when a
// creation would pass Config.MaxGroups.
func (b *Broker) PutGroup(g GroupConfig) (created bool, err error) {
	if err := ValidateGroup(g.Name); err != nil {
		return false, err
	}
	if isInternalGroup(g.Name) {
		return false, fmt.Errorf("group %q: %w", g.Name, ErrReserved)
	}
	if g.RetryQueueNums < 0 || g.RetryMaxTimes < 0 {
		return false, fmt.Errorf("group %q: retryQueueNums %d and retryMaxTimes %d must not be negative", g.Name, g.RetryQueueNums, g.RetryMaxTimes)
	}
	created, err = b.groups.put(g, time.Now(), b.events)
	if err != nil {
		return false, err
	}
	b.log.Info("subscription group updated", "group", g.Name, "created", created)
	return created, nil
}

// DeleteGroup forgets a subscription group's entry (GroupDeleted) and, with cleanOffset, its
// committed offsets and pop progress (DELETE_SUBSCRIPTIONGROUP). It fails with ErrNotFound for a group
// without an entry and ErrReserved for the broker's own group. A group whose members are
// still live is created again by their next heartbeat, unless auto-creation is off.
func (b *Broker) DeleteGroup(name string, cleanOffset bool) error {
	if isInternalGroup(name) {
		return fmt.Errorf("delete group %q: %w", name, ErrReserved)
	}
	if !b.groups.remove(name, b.events) {
		return fmt.Errorf("delete group %q: %w", name, ErrNotFound)
	}
	if cleanOffset {
		b.offsets.removeGroup(name)
		b.forgetPop(name)
	}
	b.log.Info("subscription group deleted", "group", name, "cleanOffset", cleanOffset)
	return nil
}
