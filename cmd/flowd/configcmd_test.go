package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/config"
)

// A cluster name the control plane would refuse at start fails config validate, naming the
// key and its line.
func TestConfigValidateRefusesAClusterThatIsNotASubjectToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flowd.yaml")
	require.NoError(t, os.WriteFile(path, []byte("cluster: $x\n"), 0o600))
	var out syncBuffer
	err := run(context.Background(), []string{"config", "validate", path}, &out, &out)
	require.ErrorIs(t, err, config.ErrInvalid)
	assert.Equal(t, "config "+path+`: invalid configuration: line 1: cluster: "$x" is not a valid NATS subject token: starts with '$' (reserved for NATS's own subjects)`, err.Error())
	assert.NotContains(t, out.String(), "ok")
}
