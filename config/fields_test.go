package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/fields"
)

// Every problem with a key is a *fields.Error too, the field error pipeline definitions and
// plugin manifests report, so that a caller names the setting with errors.As rather than
// by reading the message apart.
func TestInvalidErrorHoldsFieldErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`store: {flush: sometimes}
pipelines:
  - {name: p, topics: [a], parallelism: -1, sink: {type: stdout}}
`), 0o600))
	_, err := config.Load(path, []string{"FLOWD_MAX_GROUPS=lots"})
	require.ErrorIs(t, err, config.ErrInvalid)
	var inv *config.InvalidError
	require.ErrorAs(t, err, &inv)

	fes := fields.Errors(err)
	require.Len(t, fes, len(inv.Problems), err.Error())
	for i, fe := range fes {
		p := inv.Problems[i]
		assert.Equal(t, p.Key, fe.Field)
		assert.Equal(t, p.Msg, fe.Detail())
		assert.ErrorIs(t, fe, config.ErrInvalid)
		assert.Equal(t, "invalid configuration: "+p.Key+": "+p.Msg, fe.Error())
	}
	var keys []string
	for _, fe := range fes {
		keys = append(keys, fe.Field)
	}
	assert.Equal(t, []string{"store.flush", "pipelines[0].parallelism", "limits.max_groups"}, keys)
	assert.Equal(t, "environment FLOWD_MAX_GROUPS: \"lots\": cannot unmarshal !!str `lots` into int", fes[2].Detail())

	// A document that is not YAML names no setting.
	_, err = config.Decode([]byte("a: [b\n"))
	require.ErrorAs(t, err, &inv)
	assert.Empty(t, fields.Errors(err))
}
