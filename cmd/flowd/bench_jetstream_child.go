package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"

	"github.com/spf13/cobra"
)

// jsServing is the line the JetStream child prints once it serves.
var jsServing = regexp.MustCompile(`jetstream serving url=(\S+)`)

// benchJetStreamCommand is the hidden "flowd bench-jetstream-server": the bench's JetStream
// baseline as a process of its own, so that a separate run compares flowd's broker process
// with JetStream's, each apart from the clients. It serves until interrupted or killed.
func benchJetStreamCommand() *cobra.Command {
	var storeDir string
	cmd := &cobra.Command{
		Use:    "bench-jetstream-server --store-dir DIR",
		Short:  "Serve the JetStream baseline of flowd bench (started by flowd bench --deploy separate)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if storeDir == "" {
				return fmt.Errorf("bench-jetstream-server: --store-dir is required")
			}
			srv, err := startJetStreamServer(storeDir)
			if err != nil {
				return err
			}
			defer func() {
				srv.Shutdown()
				srv.WaitForShutdown()
			}()
			fmt.Fprintf(cmd.OutOrStdout(), "jetstream serving url=%s\n", srv.ClientURL())
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&storeDir, "store-dir", "", "directory of JetStream's file store")
	return cmd
}

// startJetStreamChild starts "flowd bench-jetstream-server" from bin and returns the child
// and its client URL once it serves.
func startJetStreamChild(ctx context.Context, bin, storeDir string) (*benchNode, string, error) {
	nd := &benchNode{name: "jetstream", bin: bin, args: []string{"bench-jetstream-server", "--store-dir", storeDir}}
	if err := nd.start(); err != nil {
		return nil, "", err
	}
	m, err := nd.awaitLine(ctx, jsServing)
	if err != nil {
		nd.kill()
		return nil, "", err
	}
	return nd, m[1], nil
}
