// Command flowd runs the flowd daemon, a RocketMQ-compatible broker with its built-in name
// service and NATS control plane, and talks to a running one.
//
// Usage:
//
//	flowd [serve] [--config FILE] [flags]   run the daemon (the default)
//	flowd topic|group|message|cluster|plugin … commands over NATS to a running daemon
//	flowd produce|consume …                 send and tail messages through the name service
//	flowd config defaults|validate          the configuration file
//	flowd bench [flags]                     measure throughput and delivery delay
//	flowd version                           print the version
//
// Run "flowd help" or "flowd <command> --help" for the details.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "flowd:", err)
		os.Exit(1)
	}
}

// run executes one flowd command line; main and the tests call it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRoot(stdout, stderr)
	root.SetArgs(longFlags(root, args))
	err := root.ExecuteContext(ctx)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// longFlags rewrites the single-dash long flags of serve and bench ("-data-dir x"), which
// both accepted before their command lines moved to cobra, into their double-dash form.
func longFlags(root *cobra.Command, args []string) []string {
	flags := root.Flags()
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, _, err := root.Find(args[:1])
		if err != nil || (sub.Name() != "serve" && sub.Name() != "bench") {
			return args
		}
		flags = sub.Flags()
	}
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "--" {
			copy(out[i:], args[i:])
			break
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if len(a) > 2 && a[0] == '-' && a[1] != '-' && len(name) > 1 && flags.Lookup(name) != nil {
			out[i] = "-" + a
		}
	}
	return out
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	sv := &serveCmd{}
	root := &cobra.Command{
		Use:   "flowd",
		Short: "flowd: a programmable message stream daemon that speaks RocketMQ's protocol",
		Long: `flowd: a programmable message stream daemon that speaks RocketMQ's protocol.

With no command, flowd serves (as "flowd serve"): on the embedded defaults when no
--config file is given.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE:          sv.run,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	sv.addFlags(root)

	serve := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker, its name service and the NATS control plane",
		Long: `Run the broker, its name service and the NATS control plane.

Settings come from the --config file, then FLOWD_* environment variables, then the flags
below, each overriding the one before ("flowd config defaults" lists every setting with its
variable and flag). SIGHUP re-reads the file: log.level, the plugins settings and
nats.disabled_commands apply at once; other changes are logged as needing a restart.`,
		Args: cobra.NoArgs,
	}
	sv2 := &serveCmd{}
	sv2.addFlags(serve)
	serve.RunE = sv2.run

	ver := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "flowd", version)
			return err
		},
	}
	root.AddCommand(serve, benchCommand(), benchJetStreamCommand(), benchGRPCFloorCommand(), ver, configCommand(), produceCommand(), consumeCommand())
	root.AddCommand(clientCommands()...)
	checkArgs(root)
	return root
}
