package main

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/control"
)

// eventsCommand tails the daemon's events, so that watching them needs no NATS tool.
func eventsCommand() *cobra.Command {
	o := &clientOpts{}
	var maxN int
	cmd := &cobra.Command{
		Use:   "events [KIND[.EVENT]]",
		Short: "Print the daemon's events as they happen (topic, group, plugin, pipeline, …)",
		Long: `Print the events the daemon publishes on NATS (flowd.evt.<cluster>.<kind>.<event>, CloudEvents;
see docs/control.md) as they happen: one line each, its subject then its JSON payload.
KIND[.EVENT] narrows them ("pipeline", "topic.created"); NATS wildcards work too. Stops
after --max events, or on interrupt.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			filter := ">"
			if len(args) == 1 {
				filter = args[0]
				if !strings.HasSuffix(filter, ">") && strings.Count(filter, ".") == 0 {
					filter += ".>"
				}
			}
			nc, err := o.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			ch := make(chan *nats.Msg, 256)
			sub, err := nc.ChanSubscribe(control.EventSubjectPrefix+"."+o.cluster+"."+filter, ch)
			if err != nil {
				return fmt.Errorf("events: %w", err)
			}
			defer sub.Unsubscribe()
			if err := nc.FlushTimeout(o.timeout); err != nil { // subscribed before anything is printed
				return fmt.Errorf("events: %w", err)
			}
			out := cmd.OutOrStdout()
			for n := 0; maxN <= 0 || n < maxN; n++ {
				select {
				case <-ctx.Done():
					return nil
				case m := <-ch:
					if _, err := fmt.Fprintf(out, "%s %s\n", m.Subject, m.Data); err != nil {
						return fmt.Errorf("events: %w", err)
					}
				}
			}
			return nil
		},
	}
	o.addFlags(cmd)
	cmd.Flags().IntVarP(&maxN, "max", "n", 0, "stop after this many events (0: run until interrupted)")
	return cmd
}
