package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/producer"
)

// progressOver is the input size from which produce draws a progress bar on standard error
// (when that is a terminal): a file or redirected standard input larger than this, or piped
// input once this much has been read.
const progressOver = 1 << 20

// progress draws produce's progress bar on standard error, once the input read passes its
// threshold (at once with --progress), so that small inputs draw nothing. It is the writer
// side of an io.TeeReader over the input.
type progress struct {
	w         io.Writer
	total     int64 // the input's size; -1 when unknown (a pipe): the bar counts bytes
	threshold int64
	desc      string
	read      int64
	bar       *progressbar.ProgressBar
}

func (p *progress) Write(b []byte) (int, error) {
	p.read += int64(len(b))
	if p.bar == nil {
		if p.read <= p.threshold {
			return len(b), nil
		}
		p.bar = progressbar.NewOptions64(p.total, progressbar.OptionSetWriter(p.w),
			progressbar.OptionShowBytes(true), progressbar.OptionSetDescription(p.desc),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
		_ = p.bar.Add64(p.read)
		return len(b), nil
	}
	_ = p.bar.Add(len(b))
	return len(b), nil
}

// finish clears the bar, if one was drawn.
func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func produceCommand() *cobra.Command {
	var namesrv, file, tag, keys, group string
	var props []string
	var quiet, showProgress bool
	cmd := &cobra.Command{
		Use:   "produce TOPIC [BODY...]",
		Short: "Send messages: the arguments, or each line of --file or standard input",
		Long: `Send messages to TOPIC through the name service (--namesrv). Each BODY argument is one
message; without arguments each line of --file (or of standard input) is one. When standard
error is a terminal, a progress bar is drawn there for an input larger than 1 MiB (a file, or
standard input once 1 MiB has been read); --progress draws it whatever standard error is. Each message's ids are printed, one
message a line, unless --quiet: its message id (UNIQ_KEY, for "flowd message query --unique")
and its offset message id (for "flowd message get").`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			properties := map[string]string{}
			for _, p := range props {
				k, v, ok := strings.Cut(p, "=")
				if !ok || k == "" {
					return fmt.Errorf("produce: --property %q: want key=value", p)
				}
				properties[k] = v
			}
			var keyList []string
			for _, k := range strings.Split(keys, ",") {
				if k = strings.TrimSpace(k); k != "" {
					keyList = append(keyList, k)
				}
			}
			p, err := producer.New(group, producer.WithClientOptions(client.WithNameServers(namesrv), client.WithLogger(quietLogger(cmd.ErrOrStderr()))))
			if err != nil {
				return fmt.Errorf("produce: %w", err)
			}
			if err := p.Start(ctx); err != nil {
				return noDaemon(ctx, namesrv, fmt.Errorf("produce: name service %s: %w", namesrv, err))
			}
			defer p.Close(context.Background())
			out := cmd.OutOrStdout()
			sent := 0
			send := func(body []byte) error {
				res, err := p.Send(ctx, &producer.Message{Topic: args[0], Tags: tag, Keys: keyList, Properties: properties, Body: body})
				if err != nil {
					return noDaemon(ctx, namesrv, fmt.Errorf("produce: message %d: %w", sent+1, err))
				}
				sent++
				if !quiet {
					fmt.Fprintln(out, res.MsgID, res.OffsetMsgID)
				}
				return nil
			}
			if len(args) > 1 {
				for _, b := range args[1:] {
					if err := send([]byte(b)); err != nil {
						return err
					}
				}
				return nil
			}
			var in io.Reader = cmd.InOrStdin()
			if file != "" && file != "-" {
				f, err := os.Open(file)
				if err != nil {
					return fmt.Errorf("produce: %w", err)
				}
				defer f.Close()
				in = f
			}
			if stderr := cmd.ErrOrStderr(); showProgress || isTerminal(stderr) {
				pr := &progress{w: stderr, total: -1, threshold: progressOver, desc: "produce " + args[0]}
				if showProgress {
					pr.threshold = 0
				}
				if f, ok := in.(*os.File); ok {
					if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
						pr.total = st.Size()
						if pr.total > progressOver {
							pr.threshold = 0 // large: from the first byte
						}
					}
				}
				defer pr.finish()
				in = io.TeeReader(in, pr)
			}
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 64<<10), 64<<20)
			for sc.Scan() {
				if len(sc.Bytes()) == 0 {
					continue
				}
				if err := send(append([]byte(nil), sc.Bytes()...)); err != nil {
					return err
				}
			}
			if err := sc.Err(); err != nil {
				return fmt.Errorf("produce: reading input after %d messages: %w", sent, err)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&namesrv, "namesrv", envOr("FLOWD_CTL_NAMESRV", "127.0.0.1:9876"), "name service address (env FLOWD_CTL_NAMESRV)")
	fs.StringVarP(&file, "file", "f", "", "read one message per line from this file (\"-\": standard input)")
	fs.StringVar(&tag, "tag", "", "message tag")
	fs.StringVar(&keys, "keys", "", "comma-separated message keys (indexed: see \"flowd message query\")")
	fs.StringArrayVarP(&props, "property", "p", nil, "user property key=value (repeatable)")
	fs.StringVar(&group, "group", "flowd-cli-producer", "producer group")
	fs.BoolVarP(&quiet, "quiet", "q", false, "do not print the message ids")
	fs.BoolVar(&showProgress, "progress", false, "draw a progress bar on standard error even when it is not a terminal, whatever the input's size")
	return cmd
}

// quietLogger keeps the client libraries' informational logs off the terminal.
func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// noDaemon turns err, when it says that nothing answered a connection (to the name service
// or to the broker it routes to), into the error the NATS commands give when no daemon
// answers them. Other errors are returned as they are.
func noDaemon(ctx context.Context, namesrv string, err error) error {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return err
	}
	chain := errors.Join(errNoDaemon, err)
	// Which one did not answer: the name service, or the broker address of its routes?
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	var d net.Dialer
	for _, addr := range strings.Split(namesrv, ";") {
		if c, derr := d.DialContext(ctx, "tcp", strings.TrimSpace(addr)); derr == nil {
			c.Close()
			return &cliError{fmt.Sprintf("%s on %s, the broker address the name service %s gives: is it reachable from here? (%v)", errNoDaemon, op.Addr, namesrv, op.Err), chain}
		}
	}
	return &cliError{fmt.Sprintf("%s on %s: is `flowd serve` running? (%v)", errNoDaemon, namesrv, op.Err), chain}
}

// cliError is an error whose message is written for the command line's user, over the
// error chain it stands for.
type cliError struct {
	msg string
	err error
}

func (e *cliError) Error() string { return e.msg }
func (e *cliError) Unwrap() error { return e.err }
