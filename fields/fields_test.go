package fields_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/fields"
)

var errDoc = errors.New("invalid document")

func TestErrorTextAndSentinels(t *testing.T) {
	cause := errors.New("offset out of range")
	for _, tc := range []struct {
		err  *fields.Error
		text string
	}{
		{fields.Errorf(errDoc, "limits.call_timeout", "%v is negative", -1), "invalid document: limits.call_timeout: -1 is negative"},
		{&fields.Error{Field: "offset", Err: cause, Kind: errDoc}, "invalid document: offset: offset out of range"},
		{&fields.Error{Field: "offset", Msg: "past the end", Err: cause}, "offset: past the end"},
		{&fields.Error{Msg: "required", Kind: errDoc}, "invalid document: required"},
	} {
		assert.EqualError(t, tc.err, tc.text)
		assert.Equal(t, tc.err.Kind != nil, errors.Is(tc.err, errDoc), tc.text)
		assert.Equal(t, tc.err.Err != nil, errors.Is(tc.err, cause), tc.text)
	}
}

// Errors finds every field error of a joined, wrapped error, in order.
func TestErrorsLooksThroughWrapsAndJoins(t *testing.T) {
	err := fmt.Errorf("start: %w", errors.Join(
		fields.Errorf(errDoc, "name", "bad"),
		errors.New("not a field"),
		fmt.Errorf("sink: %w", fields.Errorf(errDoc, "sink.topic", "bad")),
	))
	var got []string
	for _, fe := range fields.Errors(err) {
		got = append(got, fe.Field)
	}
	assert.Equal(t, []string{"name", "sink.topic"}, got)
	assert.Empty(t, fields.Errors(errors.New("plain")))
	assert.Empty(t, fields.Errors(nil))
}

func TestJoin(t *testing.T) {
	assert.Equal(t, "manifest.limits.call_timeout", fields.Join("manifest", "limits.call_timeout"))
	assert.Equal(t, "topics[1]", fields.Join("topics", "[1]"))
	assert.Equal(t, "sink", fields.Join("", "sink"))
	assert.Equal(t, "manifest", fields.Join("manifest", ""))
}

type request struct {
	Name   string `json:"name"`
	Limits struct {
		Pages   uint32          `json:"memory_pages"`
		Timeout fields.Duration `json:"call_timeout"`
	} `json:"limits"`
	Tags []string `json:"tags"`
}

func strict(doc string) error {
	dec := json.NewDecoder(strings.NewReader(doc))
	dec.DisallowUnknownFields()
	var r request
	return dec.Decode(&r)
}

// A strict decoding error names its field with its key path; what names no field is nil.
func TestFromJSON(t *testing.T) {
	for doc, want := range map[string]string{
		`{"colour":"red"}`:                       "invalid document: colour: unknown field",
		`{"name":1}`:                             "invalid document: name: must be a string, not number",
		`{"limits":{"memory_pages":"many"}}`:     "invalid document: limits.memory_pages: must be a number, not string",
		`{"limits":{"memory_pages":-1}}`:         "invalid document: limits.memory_pages: must be a number, not number -1",
		`{"limits":{"call_timeout":"soon"}}`:     `invalid document: limits.call_timeout: must be a duration such as "250ms" (or whole nanoseconds), not string "soon"`,
		`{"limits":{"call_timeout":true}}`:       `invalid document: limits.call_timeout: must be a duration such as "250ms" (or whole nanoseconds), not bool`,
		`{"tags":"a"}`:                           "invalid document: tags: must be an array, not string",
		`{"limits":{"memory_pages":1,"x":2}}`:    "invalid document: x: unknown field",
		`{"limits":{"call_timeout":"1s"},"z":1}`: "invalid document: z: unknown field",
	} {
		err := strict(doc)
		require.Error(t, err, doc)
		fe := fields.FromJSON(errDoc, err)
		require.NotNil(t, fe, "%s: %v", doc, err)
		assert.EqualError(t, fe, want, doc)
		assert.ErrorIs(t, fe, errDoc, doc)
	}
	for _, doc := range []string{`"a string"`, `[1]`, `{"name":`, `{"name" "x"}`} {
		err := strict(doc)
		require.Error(t, err, doc)
		assert.Nil(t, fields.FromJSON(errDoc, err), "%s: %v", doc, err)
	}
}
