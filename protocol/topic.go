package protocol

import (
	"errors"
	"fmt"
)

// ErrBadTopic is wrapped by ValidateTopic's errors.
var ErrBadTopic = errors.New("bad topic")

// ValidateTopic checks a topic name against RocketMQ's rule: 1 to MaxTopicLength (127) bytes
// of [A-Za-z0-9_%|-]. It is the one rule for every part of flowd: the broker applies it to
// topics it creates and the store to the directories it names after topics, where it also
// keeps "/" and ".." out.
func ValidateTopic(name string) error {
	ok := len(name) > 0 && len(name) <= MaxTopicLength
	for i := 0; ok && i < len(name); i++ {
		switch c := name[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '%', c == '|', c == '_', c == '-':
		default:
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("%w: %q must be 1-%d characters of [A-Za-z0-9_%%|-]", ErrBadTopic, name, MaxTopicLength)
	}
	return nil
}
