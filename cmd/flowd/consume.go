package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
)

// topicPollInterval is how often consume --wait-for-topic asks whether the topic exists.
const topicPollInterval = time.Second

// commitTimeout bounds consume --group's commit of what it printed, which outlives an
// interrupt: what was printed is committed.
const commitTimeout = 10 * time.Second

// consumedMessage is one line of consume's JSON output.
type consumedMessage struct {
	Topic      string            `json:"topic"`
	Queue      int               `json:"queue"`
	Offset     int64             `json:"offset"`
	MsgID      string            `json:"msg_id"`
	Tags       string            `json:"tags,omitempty"`
	Keys       []string          `json:"keys,omitempty"`
	Properties map[string]string `json:"properties,omitempty"`
	Body       string            `json:"body"`
	BornTime   time.Time         `json:"born_time"`
}

// consumeOpts are consume's flags.
type consumeOpts struct {
	namesrv, group, tag, sql, wasm, from, output string
	maxN                                         int
	waitForTopic                                 bool
}

func consumeCommand() *cobra.Command {
	o := &consumeOpts{}
	cmd := &cobra.Command{
		Use:   "consume TOPIC",
		Short: "Tail a topic: print its messages as they arrive",
		Long: `Tail TOPIC through the name service (--namesrv), printing each message (text: the body, one
a line; json: one object a line). Stops after --max messages, or on interrupt.

Without --group the read keeps no state on the daemon: it reads every queue of the topic
as a reader that joins no group and commits nothing, so no group, retry topic or offset is
left behind, and --from decides where reading starts, every time. With --group the
group's committed offsets decide (--from applies to a group without any), and exactly what
is printed is committed: after each batch, and on interrupt.

At most one filter, run by the broker: --tag (tag expression), --sql (SQL92 over the
properties) or --wasm (a Wasm filter plugin deployed on the daemon, "name" for its active
version or "name@version"; see "flowd plugin"). A filter the broker refuses (a SQL92 error,
a plugin not deployed) ends consume with the broker's reason.

A topic that does not exist ends consume at once, unless --wait-for-topic: then consume
waits for it and reads it from its first message.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	fs := cmd.Flags()
	fs.StringVar(&o.namesrv, "namesrv", envOr("FLOWD_CTL_NAMESRV", "127.0.0.1:9876"), "name service address (env FLOWD_CTL_NAMESRV)")
	fs.StringVar(&o.group, "group", "", "consumer group whose offsets to read from and commit (default: none, a read that leaves nothing behind)")
	fs.StringVar(&o.tag, "tag", "", `tag expression ("a || b"); default every message`)
	fs.StringVar(&o.sql, "sql", "", `SQL92 property selector ("a > 5 AND b = 'x'")`)
	fs.StringVar(&o.wasm, "wasm", "", `Wasm filter plugin deployed on the daemon: "name" or "name@version"`)
	fs.StringVar(&o.from, "from", "last", "where reading starts without a group, or for a group without committed offsets: first or last")
	fs.StringVarP(&o.output, "output", "o", "text", "text or json")
	fs.IntVarP(&o.maxN, "max", "n", 0, "stop after this many messages (0: run until interrupted)")
	fs.BoolVar(&o.waitForTopic, "wait-for-topic", false, "wait for a topic that does not exist yet, and read it from its first message")
	return cmd
}

// selector checks the flags and returns the filter they ask for and where reading starts.
func (o *consumeOpts) selector() (consumer.Selector, consumer.ConsumeFrom, error) {
	if n := btoi(o.tag != "") + btoi(o.sql != "") + btoi(o.wasm != ""); n > 1 {
		return nil, 0, errors.New("consume: --tag, --sql and --wasm cannot be combined")
	}
	var start consumer.ConsumeFrom
	switch o.from {
	case "first":
		start = consumer.ConsumeFromFirst
	case "last":
		start = consumer.ConsumeFromLast
	default:
		return nil, 0, fmt.Errorf("consume: --from %q: want first or last", o.from)
	}
	if o.output != "text" && o.output != "json" {
		return nil, 0, fmt.Errorf("consume: --output %q: want text or json", o.output)
	}
	switch {
	case o.tag != "":
		return consumer.TagSelector(o.tag), start, nil
	case o.sql != "":
		return consumer.SQLSelector(o.sql), start, nil
	case o.wasm != "":
		return consumer.WasmSelector(o.wasm), start, nil
	}
	return consumer.TagSelector("*"), start, nil
}

func (o *consumeOpts) run(cmd *cobra.Command, topic string) error {
	sel, start, err := o.selector()
	if err != nil {
		return err
	}
	// An interrupt ends the read cleanly: the group commits what was printed and leaves.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := quietLogger(cmd.ErrOrStderr())
	queues, waited, err := o.topicQueues(ctx, topic, cmd.ErrOrStderr(), log)
	if err != nil || ctx.Err() != nil {
		return err
	}
	if waited {
		start = consumer.ConsumeFromFirst // all it holds was written while consume waited
	}
	lp, err := o.open(topic, sel, start, queues, log)
	if err != nil {
		return err
	}
	if err := lp.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return noDaemon(ctx, o.namesrv, fmt.Errorf("consume: name service %s: %w", o.namesrv, err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		defer cancel()
		_ = lp.Close(cctx)
	}()
	return o.print(ctx, lp, topic, cmd.OutOrStdout(), cmd.ErrOrStderr())
}

// topicQueues returns topic's readable queues. A topic that does not exist (or has no
// readable queue) is an error, unless --wait-for-topic: then it is asked for every
// topicPollInterval until it exists (waited), or ctx ends (no queues, no error).
func (o *consumeOpts) topicQueues(ctx context.Context, topic string, stderr io.Writer, log *slog.Logger) (queues []consumer.MessageQueue, waited bool, err error) {
	probe, err := consumer.NewReader(consumer.WithClientOptions(client.WithNameServers(o.namesrv), client.WithLogger(log)))
	if err != nil {
		return nil, false, fmt.Errorf("consume: %w", err)
	}
	if err := probe.Start(ctx); err != nil {
		return nil, false, noDaemon(ctx, o.namesrv, fmt.Errorf("consume: name service %s: %w", o.namesrv, err))
	}
	defer probe.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(topicPollInterval)
	defer t.Stop()
	for {
		queues, err := probe.FetchMessageQueues(ctx, topic)
		switch {
		case ctx.Err() != nil:
			return nil, waited, nil
		case err == nil && len(queues) > 0:
			return queues, waited, nil
		case err != nil && !errors.Is(err, consumer.ErrTopicNotExist):
			return nil, waited, noDaemon(ctx, o.namesrv, fmt.Errorf("consume: name service %s: %w", o.namesrv, err))
		case !o.waitForTopic:
			what := "does not exist"
			if err == nil {
				what = "has no readable queue"
			}
			return nil, false, &cliError{fmt.Sprintf("consume: topic %q %s on %s: create it (flowd topic create %s), or wait for it with --wait-for-topic",
				topic, what, o.namesrv, topic), err}
		case !waited:
			fmt.Fprintf(stderr, "consume: topic %q does not exist yet: waiting for it (--wait-for-topic)\n", topic)
			waited = true
		}
		select {
		case <-ctx.Done():
			return nil, waited, nil
		case <-t.C:
		}
	}
}

// open makes the consumer: a member of --group subscribed to topic, committing by hand; or
// a reader of every queue of topic, following the topic's queue count.
func (o *consumeOpts) open(topic string, sel consumer.Selector, start consumer.ConsumeFrom, queues []consumer.MessageQueue, log *slog.Logger) (*consumer.LitePull, error) {
	opts := []consumer.Option{consumer.WithClientOptions(client.WithNameServers(o.namesrv), client.WithLogger(log)), consumer.WithConsumeFrom(start)}
	if o.group != "" {
		// Auto-commit would commit whole batches, printed or not: print, then commit.
		lp, err := consumer.NewLitePull(o.group, append(opts, consumer.WithAutoCommit(false))...)
		if err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		if err := lp.SubscribeSelector(topic, sel); err != nil {
			return nil, fmt.Errorf("consume: %w", err)
		}
		return lp, nil
	}
	lp, err := consumer.NewReader(opts...)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	if err := lp.SetAssignSelector(topic, sel); err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	if err := lp.Assign(queues); err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	// Registered before Start: the set known at Start is not reported, later changes are.
	if err := lp.RegisterTopicMessageQueueChangeListener(context.Background(), topic, func(_ string, qs []consumer.MessageQueue) {
		if err := lp.Assign(qs); err != nil {
			log.Warn("consume: follow the topic's queues", "topic", topic, "err", err)
		}
	}); err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return lp, nil
}

// print polls and prints until --max messages are printed or ctx ends, committing after
// each batch, with --group, exactly what of it was printed.
func (o *consumeOpts) print(ctx context.Context, lp *consumer.LitePull, topic string, out, stderr io.Writer) error {
	enc := json.NewEncoder(out)
	got := 0
	for o.maxN <= 0 || got < o.maxN {
		msgs, err := lp.Poll(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return o.pollError(topic, got, err)
		}
		if o.maxN > 0 {
			msgs = msgs[:min(len(msgs), o.maxN-got)]
		}
		printed := 0
		var perr error
		for _, m := range msgs {
			if o.output == "json" {
				perr = enc.Encode(consumedMessage{Topic: m.Topic, Queue: m.Queue.QueueID, Offset: m.QueueOffset, MsgID: m.MsgID,
					Tags: m.Tags, Keys: m.Keys, Properties: m.Properties(), Body: string(m.Body), BornTime: m.BornTimestamp})
			} else {
				_, perr = fmt.Fprintln(out, string(m.Body))
			}
			if perr != nil {
				break
			}
			printed++
		}
		got += printed
		if err := o.commit(ctx, lp, msgs[:printed], stderr); err != nil {
			return err
		}
		if perr != nil {
			return fmt.Errorf("consume: %w", perr)
		}
	}
	return nil
}

// commit commits, with --group, the offset past the last of msgs in each of their queues.
// A queue a rebalance took away meanwhile is not ours to commit: its next owner reads again
// what was printed of it.
func (o *consumeOpts) commit(ctx context.Context, lp *consumer.LitePull, msgs []*consumer.Message, stderr io.Writer) error {
	if o.group == "" || len(msgs) == 0 {
		return nil
	}
	offsets := map[consumer.MessageQueue]int64{}
	for _, m := range msgs {
		offsets[m.Queue] = max(offsets[m.Queue], m.QueueOffset+1)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	err := lp.CommitOffsets(cctx, offsets)
	if errors.Is(err, consumer.ErrNotAssigned) {
		fmt.Fprintf(stderr, "consume: not committed, the group's rebalance moved the queue: %v\n", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("consume: commit what was printed: %w", err)
	}
	return nil
}

// pollError is the error of a Poll that failed: for a refusal, the broker's reason.
func (o *consumeOpts) pollError(topic string, got int, err error) error {
	reason := err.Error()
	var be *consumer.BrokerError
	if errors.As(err, &be) && be.Remark != "" {
		reason = be.Remark
	}
	switch {
	case errors.Is(err, consumer.ErrSubscriptionRefused):
		return &cliError{"consume: the broker refused the filter: " + reason, err}
	case errors.Is(err, consumer.ErrTopicNotExist):
		return &cliError{fmt.Sprintf("consume: topic %q does not exist (any more): %s", topic, reason), err}
	case errors.Is(err, consumer.ErrGroupNotExist):
		return &cliError{fmt.Sprintf("consume: the daemon does not create groups (create %q there first): %s", o.group, reason), err}
	}
	return fmt.Errorf("consume: after %d messages: %w", got, err)
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
