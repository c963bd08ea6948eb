package protocol

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestValidateTopic(t *testing.T) {
	for _, good := range []string{"a", "Topic_1", "%RETRY%group", "%DLQ%g-1", "a|b", strings.Repeat("x", MaxTopicLength)} {
		assert.NoError(t, ValidateTopic(good), good)
	}
	for _, bad := range []string{"", "a/b", "..", "a.b", "sp ace", "tab\t", "é", strings.Repeat("x", MaxTopicLength+1)} {
		assert.ErrorIs(t, ValidateTopic(bad), ErrBadTopic, bad)
	}
}
