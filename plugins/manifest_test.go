package plugins

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/fields"
)

const validManifest = `{
  "name": "big-orders", "kind": "filter", "version": "1.2.0-rc.1+build.5", "abi": 1,
  "limits": {"memory_pages": 64, "call_timeout": "100ms", "max_instances": 2},
  "policy": {"on_fault": "reload", "restart_budget": 5, "restart_window": "30s"},
  "parameters": {"threshold": "100"},
  "wants_body": true,
  "sha256": "` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `"
}`

func TestParseManifestValid(t *testing.T) {
	m, err := ParseManifest([]byte(validManifest))
	require.NoError(t, err)
	require.Equal(t, "big-orders", m.Name)
	require.Equal(t, KindFilter, m.Kind)
	require.Equal(t, Duration(100*time.Millisecond), m.Limits.CallTimeout)
	require.Equal(t, Duration(30*time.Second), m.Policy.RestartWindow)
	require.Equal(t, "100", m.Parameters["threshold"])
	require.True(t, m.WantsBody)

	// It round-trips through the registry's own encoding.
	b, err := json.Marshal(m)
	require.NoError(t, err)
	again, err := ParseManifest(b)
	require.NoError(t, err)
	require.Equal(t, m, again)
}

func TestParseManifestRefusesUnknownFieldsNamingThem(t *testing.T) {
	for _, field := range []string{`"colour": "red"`, `"limits": {"memory": 3}`, `"policy": {"onFault": "reload"}`} {
		doc := strings.Replace(validManifest, `"abi": 1,`, `"abi": 1, `+field+`,`, 1)
		if strings.HasPrefix(field, `"limits"`) || strings.HasPrefix(field, `"policy"`) {
			// Replace the real object so the key is not duplicated.
			doc = strings.Replace(validManifest, `"limits": {"memory_pages": 64, "call_timeout": "100ms", "max_instances": 2}`, `"limits": {"memory": 3}`, 1)
			if strings.HasPrefix(field, `"policy"`) {
				doc = strings.Replace(validManifest, `"policy": {"on_fault": "reload", "restart_budget": 5, "restart_window": "30s"}`, field, 1)
			}
		}
		_, err := ParseManifest([]byte(doc))
		require.ErrorIs(t, err, ErrManifest, field)
		name := field[1 : strings.Index(field[1:], `"`)+1]
		if strings.Contains(field, "{") {
			inner := field[strings.Index(field, "{")+2:]
			name = inner[:strings.Index(inner, `"`)]
		}
		fes := fields.Errors(err)
		require.Len(t, fes, 1, "%s: %v", field, err)
		require.Equal(t, name, fes[0].Field, field)
		require.Equal(t, "unknown field", fes[0].Detail(), field)
		require.Contains(t, err.Error(), name+": unknown field", field)
	}
	_, err := ParseManifest([]byte(validManifest + `{}`))
	require.ErrorIs(t, err, ErrManifest)
}

func TestManifestValidateNamesTheField(t *testing.T) {
	cases := map[string]func(m *Manifest){
		"name":                  func(m *Manifest) { m.Name = "../etc" },
		"kind":                  func(m *Manifest) { m.Kind = "router" },
		"version":               func(m *Manifest) { m.Version = "1.2" },
		"abi":                   func(m *Manifest) { m.ABI = 2 },
		"limits.memory_pages":   func(m *Manifest) { m.Limits.MemoryPages = MaxMemoryPages + 1 },
		"limits.call_timeout":   func(m *Manifest) { m.Limits.CallTimeout = -1 },
		"limits.max_instances":  func(m *Manifest) { m.Limits.MaxInstances = -1 },
		"policy.on_fault":       func(m *Manifest) { m.Policy.OnFault = "retry" },
		"policy.restart_budget": func(m *Manifest) { m.Policy.RestartBudget = -1 },
		"policy.restart_window": func(m *Manifest) { m.Policy.RestartWindow = -1 },
		"wants_body":            func(m *Manifest) { m.Kind = KindAllocator },
		"parameters":            func(m *Manifest) { m.Parameters = map[string]string{"": "x"} },
		"sha256":                func(m *Manifest) { m.SHA256 = "ABC" },
	}
	for field, breakIt := range cases {
		m, err := ParseManifest([]byte(validManifest))
		require.NoError(t, err)
		breakIt(m)
		err = m.Validate()
		require.ErrorIs(t, err, ErrManifest, field)
		require.True(t, strings.Contains(err.Error(), ": "+field+": "), "%s: %v", field, err)
		var fe *fields.Error
		require.ErrorAs(t, err, &fe, field)
		require.Equal(t, field, fe.Field)
		require.False(t, errors.Is(err, ErrNotFound))
	}
}

// A value of the wrong type, a duration that does not parse included, is an error naming
// the field by its key path.
func TestParseManifestNamesTheFieldOfAValueOfTheWrongType(t *testing.T) {
	for field, replace := range map[string][2]string{
		"limits.memory_pages":   {`"memory_pages": 64`, `"memory_pages": "many"`},
		"limits.call_timeout":   {`"call_timeout": "100ms"`, `"call_timeout": "soon"`},
		"policy.restart_window": {`"restart_window": "30s"`, `"restart_window": true`},
		"wants_body":            {`"wants_body": true`, `"wants_body": "yes"`},
		"parameters":            {`"threshold": "100"`, `"threshold": 100`}, // json names the map, not the key
	} {
		doc := strings.Replace(validManifest, replace[0], replace[1], 1)
		require.NotEqual(t, validManifest, doc, field)
		_, err := ParseManifest([]byte(doc))
		require.ErrorIs(t, err, ErrManifest, field)
		var fe *fields.Error
		require.ErrorAs(t, err, &fe, "%s: %v", field, err)
		require.Equal(t, field, fe.Field, err.Error())
		require.Contains(t, err.Error(), ErrManifest.Error()+": "+field+": must be ", field)
	}
}

// Durations are the pipeline definitions' own: a whole number in JSON is nanoseconds.
func TestManifestDurationsTakeNanoseconds(t *testing.T) {
	doc := strings.Replace(validManifest, `"call_timeout": "100ms"`, `"call_timeout": 100000000`, 1)
	m, err := ParseManifest([]byte(doc))
	require.NoError(t, err)
	require.Equal(t, Duration(100*time.Millisecond), m.Limits.CallTimeout)
}
