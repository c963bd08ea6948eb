package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// checkArgs makes every command of the tree under root refuse what it cannot run: a word
// that is not one of a command's subcommands ("flowd topic creat") is an unknown command,
// with the closest names suggested, and a wrong number of arguments names the arguments the
// command takes. Cobra alone prints a group's help and exits 0 for the first, and says
// "accepts 1 arg(s)" for the second. A command group given nothing prints its help.
func checkArgs(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.HasSubCommands() {
			c.SuggestionsMinimumDistance = 2
			if !c.Runnable() {
				c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
			c.Args = unknownCommand
			return
		}
		if inner := c.Args; inner != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if inner(cmd, args) != nil {
					return wrongArgs(cmd, args)
				}
				return nil
			}
		}
	}
	walk(root)
}

// unknownCommand refuses arguments to a command whose arguments are its subcommands' names.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	var hint strings.Builder
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint.WriteString("\n\nDid you mean this?\n")
		for _, name := range s {
			fmt.Fprintf(&hint, "\t%s\n", name)
		}
		hint.WriteString("\n")
	} else {
		hint.WriteString("; ")
	}
	return fmt.Errorf("unknown command %q for %q%srun %q for its commands", args[0], cmd.CommandPath(), hint.String(), cmd.CommandPath()+" --help")
}

// wrongArgs is the error of a command given arguments it does not take.
func wrongArgs(cmd *cobra.Command, args []string) error {
	want := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(strings.TrimPrefix(cmd.Use, cmd.Name())), "[flags]"))
	if want == "" {
		want = "no arguments"
	}
	got := "got " + strconv.Itoa(len(args)) + " arguments"
	if len(args) == 1 {
		got = "got 1 argument"
	}
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = strconv.Quote(a)
	}
	if len(args) > 0 {
		got += ": " + strings.Join(quoted, " ")
	}
	// main prefixes every error with "flowd: ".
	name := strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
	return fmt.Errorf("%s: want %s, %s (see %q)", name, want, got, cmd.CommandPath()+" --help")
}
