package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/config"
)

func configCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Print the default configuration or check a configuration file"}
	defaults := &cobra.Command{
		Use:   "defaults",
		Short: "Print every setting with its default, variable and flag, as a YAML file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := config.DefaultsYAML()
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(raw)
			return err
		},
	}
	validate := &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a configuration file on its own (no FLOWD_* variables); exit non-zero with its errors",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := config.Load(args[0], nil); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s: ok\n", args[0])
			return err
		},
	}
	cmd.AddCommand(defaults, validate)
	return cmd
}
