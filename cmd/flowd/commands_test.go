package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runOut runs one command line as main does and returns what it printed and its error (main
// exits 1 on an error).
func runOut(args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), args, &out, &out)
	return out.String(), err
}

// A mistyped subcommand or a wrong number of arguments is an error (a non-zero exit) that
// names what was expected and suggests the closest command; a command group alone prints
// its help.
func TestUnknownSubcommandsAndWrongArgumentsAreErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"topic", "creat", "orders"}, []string{`unknown command "creat" for "flowd topic"`, "Did you mean this?", "create"}},
		{[]string{"topc", "list"}, []string{`unknown command "topc" for "flowd"`, "topic"}},
		{[]string{"group", "lst"}, []string{`unknown command "lst" for "flowd group"`, "list"}},
		{[]string{"plugin", "frobnicate"}, []string{`unknown command "frobnicate" for "flowd plugin"`, "flowd plugin --help"}},
		{[]string{"topic", "create"}, []string{"flowd topic create", "TOPIC", "got 0 arguments"}},
		{[]string{"topic", "create", "a", "b"}, []string{"flowd topic create", "TOPIC", "got 2 arguments"}},
		{[]string{"group", "reset", "g"}, []string{"flowd group reset", "GROUP TOPIC", "got 1 argument"}},
		{[]string{"topic", "list", "extra"}, []string{"flowd topic list", "no arguments", "got 1 argument"}},
		{[]string{"plugin", "activate", "region"}, []string{"flowd plugin activate", "NAME@VERSION"}},
		{[]string{"plugin", "remove", "region@"}, []string{"flowd plugin remove", "NAME@VERSION", `"region@"`}},
		{[]string{"plugin", "activate", "region@1", "2"}, []string{"flowd plugin activate", "NAME@VERSION"}},
		{[]string{"consume"}, []string{"flowd consume", "TOPIC", "got 0 arguments"}},
		{[]string{"produce"}, []string{"flowd produce", "TOPIC [BODY...]", "got 0 arguments"}},
		{[]string{"config", "validte", "x.yaml"}, []string{`unknown command "validte" for "flowd config"`, "validate"}},
		{[]string{"bench", "extra"}, []string{"flowd bench", "no arguments"}},
	} {
		out, err := runOut(c.args...)
		require.Error(t, err, "%v exits non-zero: %s", c.args, out)
		for _, w := range c.want {
			assert.Contains(t, err.Error(), w, "%v", c.args)
		}
	}
	for _, args := range [][]string{{"topic"}, {"plugin"}, {"config"}} {
		out, err := runOut(args...)
		require.NoError(t, err, "%v", args)
		assert.Contains(t, out, "Available Commands:", "%v prints its help", args)
	}
}

// plugin activate and remove take a version as "name@version", the spelling --wasm and
// pipelines use, and still the two arguments "name version".
func TestPluginCommandsTakeNameAtVersion(t *testing.T) {
	d := startServed(t, "")
	dir := t.TempDir()
	mod := filepath.Join(dir, "propfilter.wasm")
	require.NoError(t, os.WriteFile(mod, propfilter(t), 0o600))
	ctl := []string{"--nats", d.nats}
	for _, v := range []string{"1.0.0", "2.0.0"} {
		man := filepath.Join(dir, v+".json")
		require.NoError(t, os.WriteFile(man, []byte(`{"name":"region","kind":"filter","version":"`+v+`","abi":1,"parameters":{"property":"region","value":"eu"}}`), 0o600))
		_, err := cli(t, "", append([]string{"plugin", "deploy", mod, man}, ctl...)...)
		require.NoError(t, err)
	}
	out, err := cli(t, "", append([]string{"plugin", "activate", "region@2.0.0"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^region\s+2\.0\.0\s+filter\s+true$`, out)
	out, err = cli(t, "", append([]string{"plugin", "activate", "region", "1.0.0"}, ctl...)...)
	require.NoError(t, err, "the two-argument form still works")
	assert.Regexp(t, `(?m)^region\s+1\.0\.0\s+filter\s+true$`, out)
	out, err = cli(t, "", append([]string{"plugin", "remove", "region@2.0.0"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^region\s+2\.0\.0\s+filter\s+false$`, out)
	out, err = cli(t, "", append([]string{"plugin", "list", "region@1.0.0"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^NAME\s+VERSION\s+KIND\s+ACTIVE\nregion\s+1\.0\.0\s+filter\s+true\n$`, out)
}

// flowd bench's help is cobra's, like every other command's, with every flag and its
// default; CI's command line parses, and the single-dash spelling of Go's flag package too.
func TestBenchHelpAndFlags(t *testing.T) {
	out, err := runOut("bench", "--help")
	require.NoError(t, err)
	assert.Contains(t, out, "Usage:\n  flowd bench [flags]")
	assert.Contains(t, out, "Flags:")
	for _, f := range []string{"--messages int", "(default 50000)", "--sizes string", `(default "128,1024")`, "--latency-samples int",
		"--sync-producers int", "(default 64)", "--json", "--scenarios string", "--list", "--baseline string", `(default "jetstream")`,
		"--namesrv string", "--data-dir string", "--size int", "--inflight int", "--queues int", "--producers int", "--rate int",
		"--batch int", "--cpuprofile FILE", "--deploy string", `(default "separate")`} {
		assert.Contains(t, out, f)
	}
	assert.NotContains(t, out, "Usage of bench")

	ci := []string{"bench", "--messages", "2000", "--sizes", "1024", "--latency-samples", "1000", "--sync-producers", "16", "--json",
		"--scenarios", "produce-1024-*,e2e-delay-p99", "--list"}
	out, err = runOut(ci...)
	require.NoError(t, err)
	assert.Equal(t, "produce-1024-async\nproduce-1024-async-p8\nproduce-1024-sync\nproduce-1024-sync-p8\nproduce-1024-batched\nproduce-1024-batched-p8\nproduce-1024-syncflush-p16\ne2e-delay\n", out)
	out, err = runOut("bench", "-sizes", "512", "-scenarios", "disk-write-*", "-list")
	require.NoError(t, err)
	assert.Equal(t, "disk-write-512\n", out)
	_, err = runOut("bench", "--deploy", "elsewhere", "--list")
	require.ErrorContains(t, err, "--deploy")
	_, err = runOut("bench", "--mesages", "5")
	require.ErrorContains(t, err, "unknown flag: --mesages")
	assert.True(t, strings.HasPrefix(out, "disk-write"))
}
