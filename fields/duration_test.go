package fields_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/flowd-io/flowd/fields"
)

type durationDoc struct {
	D fields.Duration `json:"d" yaml:"d"`
}

// JSON takes what the pipeline definitions' and the manifests' durations took: a Go
// duration string, and (the definitions') a whole number of nanoseconds.
func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string // the field error's detail; "" for none
	}{
		{`"250ms"`, 250 * time.Millisecond, ""},
		{`"1m30s"`, 90 * time.Second, ""},
		{`"-1s"`, -time.Second, ""},
		{`"0"`, 0, ""},
		{`1500000`, 1500 * time.Microsecond, ""},
		{`0`, 0, ""},
		{`-5`, -5, ""},
		{`"soon"`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not string "soon"`},
		{`"5"`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not string "5"`},
		{`""`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not string ""`},
		{`1.5`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not number 1.5`},
		{`1e3`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not number 1e3`},
		{`true`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not bool`},
		{`null`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not null`},
		{`{}`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not object`},
		{`["1s"]`, 0, `must be a duration such as "250ms" (or whole nanoseconds), not array`},
	} {
		var doc durationDoc
		err := json.Unmarshal([]byte(`{"d":`+tc.in+`}`), &doc)
		if tc.err == "" {
			require.NoError(t, err, tc.in)
			assert.Equal(t, fields.Duration(tc.want), doc.D, tc.in)
			continue
		}
		require.Error(t, err, tc.in)
		fe := fields.FromJSON(nil, err)
		require.NotNil(t, fe, "%s: %v", tc.in, err)
		assert.Equal(t, "d", fe.Field, tc.in)
		assert.Equal(t, tc.err, fe.Detail(), tc.in)
	}
}

// YAML takes duration strings, as the pipeline definitions' did; a number has no unit.
func TestDurationYAML(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string // the error's text; "" for none
	}{
		{`250ms`, 250 * time.Millisecond, ""},
		{`"1m30s"`, 90 * time.Second, ""},
		{`-1s`, -time.Second, ""},
		{`0`, 0, ""},
		{`soon`, 0, `yaml: unmarshal errors:` + "\n" + `  line 1: duration "soon": time: invalid duration "soon"`},
		{`1500`, 0, `yaml: unmarshal errors:` + "\n" + `  line 1: duration "1500": time: missing unit in duration "1500"`},
	} {
		var doc durationDoc
		err := yaml.Unmarshal([]byte(`d: `+tc.in), &doc)
		if tc.err == "" {
			require.NoError(t, err, tc.in)
			assert.Equal(t, fields.Duration(tc.want), doc.D, tc.in)
			continue
		}
		require.EqualError(t, err, tc.err, tc.in)
		var te *yaml.TypeError
		assert.ErrorAs(t, err, &te, "yaml goes on decoding the rest of the document")
	}
}

// Both encodings write the duration string, and read back what they wrote.
func TestDurationRoundTrips(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, 250 * time.Millisecond, 90 * time.Second, -time.Second} {
		doc := durationDoc{D: fields.Duration(d)}
		j, err := json.Marshal(doc)
		require.NoError(t, err)
		assert.JSONEq(t, `{"d":"`+d.String()+`"}`, string(j))
		var fromJSON durationDoc
		require.NoError(t, json.Unmarshal(j, &fromJSON))
		assert.Equal(t, doc, fromJSON)

		y, err := yaml.Marshal(doc)
		require.NoError(t, err)
		assert.Equal(t, "d: "+d.String()+"\n", string(y))
		var fromYAML durationDoc
		require.NoError(t, yaml.Unmarshal(y, &fromYAML))
		assert.Equal(t, doc, fromYAML)
	}
}
