package subjects_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/flowd-io/flowd/internal/subjects"
)

func TestToken(t *testing.T) {
	for name, reason := range map[string]string{
		"local":      "",
		"eu-west_1":  "",
		"Ünïcode":    "",
		"a$":         "", // '$' is reserved only at the start
		"":           "empty",
		"$x":         "starts with '$' (reserved for NATS's own subjects)",
		"$SYS":       "starts with '$' (reserved for NATS's own subjects)",
		"eu.west":    "contains '.'",
		".":          "contains '.'",
		"*":          "contains '*'",
		"a*":         "contains '*'",
		">":          "contains '>'",
		"a>b":        "contains '>'",
		"a b":        "contains white space",
		" ":          "contains white space",
		"a\tb":       "contains white space",
		"a\nb":       "contains white space",
		"a\rb":       "contains white space",
		"a\fb":       "contains white space",
		"a\x00b":     "contains a NUL byte",
		"a\xffb":     "is not valid UTF-8",
		"$a.b":       "starts with '$' (reserved for NATS's own subjects)",
		"ok.but two": "contains '.'",
	} {
		err := subjects.Token(name)
		if reason == "" {
			assert.NoError(t, err, "%q", name)
			continue
		}
		assert.ErrorIs(t, err, subjects.ErrInvalid, "%q", name)
		var ne *subjects.Error
		if assert.ErrorAs(t, err, &ne, "%q", name) {
			assert.Equal(t, subjects.Error{Name: name, What: "subject token", Reason: reason}, *ne, "%q", name)
		}
	}
	assert.EqualError(t, subjects.Token("$x"), `"$x" is not a valid NATS subject token: starts with '$' (reserved for NATS's own subjects)`)
}

func TestLiteral(t *testing.T) {
	for subject, reason := range map[string]string{
		"orders":         "",
		"orders.eu.out":  "",
		"$KV.bucket.key": "", // publishing to NATS's own subjects is allowed
		"a*.b>":          "", // wildcards only as whole tokens
		"":               "empty",
		"a..b":           "token 2 is empty",
		".a":             "token 1 is empty",
		"a.":             "token 2 is empty",
		"orders.*":       "token 2 is the wildcard '*' (messages are published to literal subjects)",
		">":              "token 1 is the wildcard '>' (messages are published to literal subjects)",
		"orders out":     "contains white space",
		"orders\r\n":     "contains white space",
		"a\x00":          "contains a NUL byte",
		"\xc3":           "is not valid UTF-8",
	} {
		err := subjects.Literal(subject)
		if reason == "" {
			assert.NoError(t, err, "%q", subject)
			continue
		}
		assert.ErrorIs(t, err, subjects.ErrInvalid, "%q", subject)
		assert.EqualError(t, err, (&subjects.Error{Name: subject, What: "subject", Reason: reason}).Error(), "%q", subject)
	}
}
