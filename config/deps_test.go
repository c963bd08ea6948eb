package config_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// config describes settings and is read by `flowd config validate`: it must not drag the
// Wasm runtime, NATS or the metrics into whatever imports it. Of flowd it may import only
// the pipeline definitions, the NATS name rules and the field error, leaves themselves.
func TestConfigDependsOnLeavesOnly(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to list the dependencies with")
	}
	out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", ".").Output()
	require.NoError(t, err, "go list -deps")
	allowed := map[string]bool{
		"github.com/flowd-io/flowd/config":              true,
		"github.com/flowd-io/flowd/pipeline/definition": true,
		"github.com/flowd-io/flowd/internal/subjects":   true,
		"github.com/flowd-io/flowd/fields":              true,
	}
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/flowd-io/flowd/") {
			if !allowed[pkg] {
				bad = append(bad, pkg)
			}
			continue
		}
		if strings.Contains(pkg, "wazero") || strings.Contains(pkg, "nats") || strings.Contains(pkg, "prometheus") {
			bad = append(bad, pkg)
		}
	}
	require.Empty(t, bad, "config depends on packages it must not")
}
