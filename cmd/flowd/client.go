package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/control"
)

// errNoDaemon is returned by the client commands when nothing serves the command subject.
var errNoDaemon = errors.New("no flowd answers")

// clientOpts are the flags of the commands that talk to a running daemon over NATS.
type clientOpts struct {
	url     string
	cluster string
	token   string
	creds   string
	user    string
	timeout time.Duration
	json    bool
}

func (o *clientOpts) addFlags(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&o.url, "nats", envOr("FLOWD_CTL_NATS", "nats://127.0.0.1:4222"), "NATS URL of the daemon's control plane (env FLOWD_CTL_NATS)")
	fs.StringVar(&o.cluster, "cluster", envOr("FLOWD_CLUSTER", "local"), "cluster name of the daemon (env FLOWD_CLUSTER)")
	fs.StringVar(&o.token, "nats-token", "", "token for the NATS server (env FLOWD_NATS_TOKEN)")
	fs.StringVar(&o.creds, "nats-creds", "", "NATS credentials file")
	fs.StringVar(&o.user, "nats-user", "", "user:password for the NATS server")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for the daemon's reply")
	fs.BoolVar(&o.json, "json", false, "print the daemon's JSON reply instead of a table")
}

func envOr(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

// request sends one command ("topic.create") and decodes the reply into out. Error replies
// become errors with the daemon's code and message.
func (o *clientOpts) request(ctx context.Context, command string, req, out any) ([]byte, error) {
	nc, err := o.connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	var body []byte
	if req != nil {
		if body, err = json.Marshal(req); err != nil {
			return nil, fmt.Errorf("%s: %w", command, err)
		}
	}
	subject := control.SubjectPrefix + "." + o.cluster + "." + command
	rctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(rctx, subject, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w on %s (cluster %q, command %s): is `flowd serve` running?", errNoDaemon, o.url, o.cluster, command)
	}
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", command, o.url, err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		var er control.ErrorReply
		if json.Unmarshal(msg.Data, &er) == nil && er.Error.Message != "" {
			return nil, fmt.Errorf("%s: %d %s", command, er.Error.Code, er.Error.Message)
		}
		return nil, fmt.Errorf("%s: %s %s", command, code, msg.Header.Get("Nats-Service-Error"))
	}
	if out != nil {
		if err := json.Unmarshal(msg.Data, out); err != nil {
			return nil, fmt.Errorf("%s: reply: %w", command, err)
		}
	}
	return msg.Data, nil
}

// connect connects to the daemon's NATS server with the credentials given.
func (o *clientOpts) connect() (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("flowd-cli"), nats.Timeout(o.timeout), nats.NoReconnect()}
	token := o.token
	if token == "" {
		token = os.Getenv("FLOWD_NATS_TOKEN")
	}
	if token != "" {
		opts = append(opts, nats.Token(token))
	}
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	if u, p, ok := strings.Cut(o.user, ":"); ok {
		opts = append(opts, nats.UserInfo(u, p))
	}
	nc, err := nats.Connect(o.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w on %s: is `flowd serve` running? (%v)", errNoDaemon, o.url, err)
	}
	return nc, nil
}

// call runs a command and prints either the raw JSON (--json) or what show prints; the
// nodes a gathered reply lacks are named on standard error.
func call[T any](cmd *cobra.Command, o *clientOpts, command string, req any, show func(w io.Writer, r *T)) error {
	var reply T
	raw, err := o.request(cmd.Context(), command, req, &reply)
	if err != nil {
		return err
	}
	defer warnMissing(cmd.ErrOrStderr(), raw)
	w := cmd.OutOrStdout()
	if o.json {
		_, err := fmt.Fprintln(w, string(raw))
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	show(tw, &reply)
	return tw.Flush()
}

func clientCommands() []*cobra.Command {
	return []*cobra.Command{topicCommand(), groupCommand(), messageCommand(), brokerCommand(), clusterCommand(), pluginCommand(), pipelineCommand(), eventsCommand()}
}

func printTopics(w io.Writer, ts ...control.TopicView) {
	fmt.Fprintln(w, "TOPIC\tREAD\tWRITE\tPERM\tORDER\tKIND")
	for _, t := range ts {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%t\t%s\n", t.Topic, t.ReadQueues, t.WriteQueues, t.Perm, t.Order, t.Kind)
	}
}

func topicCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "topic", Short: "Create, list, describe and delete topics of a running daemon"}
	o.addFlags(cmd)
	var queues, readQ, writeQ int
	var perm string
	var order bool
	create := &cobra.Command{
		Use: "create TOPIC", Short: "Create a topic", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := map[string]any{"topic": args[0], "queues": queues, "perm": perm, "order": order}
			if readQ > 0 {
				req["read_queues"] = readQ
			}
			if writeQ > 0 {
				req["write_queues"] = writeQ
			}
			return call(cmd, o, "topic.create", req, func(w io.Writer, r *control.TopicReply) { printTopics(w, r.Topic) })
		},
	}
	create.Flags().IntVar(&queues, "queues", 4, "read and write queue count")
	create.Flags().IntVar(&readQ, "read-queues", 0, "read queue count (default: --queues)")
	create.Flags().IntVar(&writeQ, "write-queues", 0, "write queue count (default: --queues)")
	create.Flags().StringVar(&perm, "perm", "rw", "rw, r, w or none")
	create.Flags().BoolVar(&order, "order", false, "ordered topic")
	var listScope scopeOpts
	list := &cobra.Command{
		Use: "list", Short: "List the topics (in a cluster: every node's, with their brokers)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, o, "topic.list", listScope.request(nil), printTopicList)
		},
	}
	listScope.addFlags(list)
	describe := &cobra.Command{
		Use: "describe TOPIC", Short: "Show a topic's queues and message counts", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, o, "topic.describe", control.TopicRef{Topic: args[0]}, func(w io.Writer, r *control.TopicDescribeReply) {
				printTopics(w, r.Topic)
				fmt.Fprintf(w, "\nmessages\t%d\n", r.Messages)
				if r.Rate != nil {
					fmt.Fprintf(w, "rate\t%.1f/s\n", *r.Rate)
				}
				fmt.Fprintln(w, "\nQUEUE\tMIN OFFSET\tMAX OFFSET")
				for _, q := range r.Queues {
					fmt.Fprintf(w, "%d\t%d\t%d\n", q.Queue, q.MinOffset, q.MaxOffset)
				}
			})
		},
	}
	del := &cobra.Command{
		Use: "delete TOPIC", Short: "Delete a topic (its messages stay until retention)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, o, "topic.delete", control.TopicRef{Topic: args[0]}, func(w io.Writer, r *control.TopicDeleteReply) {
				fmt.Fprintf(w, "deleted %s\n", r.Topic)
			})
		},
	}
	cmd.AddCommand(create, list, describe, del)
	return cmd
}

func groupCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "group", Short: "List, describe and reset consumer groups of a running daemon"}
	o.addFlags(cmd)
	var listScope scopeOpts
	list := &cobra.Command{
		Use: "list", Short: "List the groups with their lag (in a cluster: over every broker)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, o, "group.list", listScope.request(nil), printGroupList)
		},
	}
	listScope.addFlags(list)
	var describeScope scopeOpts
	describe := &cobra.Command{
		Use: "describe GROUP", Short: "Show a group's members and its lag per queue (in a cluster: of every broker)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, o, "group.describe", describeScope.request(map[string]any{"group": args[0]}), printGroup)
		},
	}
	describeScope.addFlags(describe)
	var to, ts string
	reset := &cobra.Command{
		Use: "reset GROUP TOPIC", Short: "Move a group's offsets of a topic (--to earliest|latest or --timestamp)", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := control.ResetRequest{Group: args[0], Topic: args[1], To: to}
			if ts != "" {
				if _, err := strconv.ParseInt(ts, 10, 64); err == nil {
					req.Timestamp = json.RawMessage(ts)
				} else {
					raw, _ := json.Marshal(ts)
					req.Timestamp = raw
				}
			}
			return call(cmd, o, "group.reset_offset", req, func(w io.Writer, r *control.ResetReply) {
				fmt.Fprintf(w, "reset %s on %s\n", args[0], args[1])
			})
		},
	}
	reset.Flags().StringVar(&to, "to", "", "earliest or latest")
	reset.Flags().StringVar(&ts, "timestamp", "", "Unix milliseconds or an RFC 3339 time")
	cmd.AddCommand(list, describe, reset)
	return cmd
}

func printMessage(w io.Writer, m *control.MessageReply) {
	fmt.Fprintf(w, "msg_id\t%s\ntopic\t%s\nqueue\t%d\noffset\t%d\nstore_time\t%s\nborn_host\t%s\nbody_size\t%d\n",
		m.MsgID, m.Topic, m.Queue, m.Offset, m.StoreTime.Format(time.RFC3339Nano), m.BornHost, m.BodySize)
	keys := make([]string, 0, len(m.Properties))
	for k := range m.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "property %s\t%s\n", k, m.Properties[k])
	}
	fmt.Fprintf(w, "body\t%s\n", strconv.Quote(string(m.Body)))
}

func messageCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "message", Short: "Look up messages of a running daemon by id or key"}
	o.addFlags(cmd)
	get := &cobra.Command{
		Use: "get MSG_ID", Short: "Show one message by its offset message id (the second id flowd produce prints)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, o, "message.get", control.MessageRef{MsgID: args[0]}, func(w io.Writer, r *control.MessageReply) { printMessage(w, r) })
		},
	}
	var maxN int
	var unique bool
	query := &cobra.Command{
		Use: "query TOPIC KEY", Short: "Find the messages of a topic with a key", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := control.MessageQueryRequest{Topic: args[0], Key: args[1], Unique: unique}
			if maxN > 0 {
				req.Max = &maxN
			}
			return call(cmd, o, "message.query", req, func(w io.Writer, r *control.MessageQueryReply) {
				fmt.Fprintln(w, "MSG_ID\tQUEUE\tOFFSET\tSTORE TIME\tBODY SIZE")
				for _, m := range r.Messages {
					fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\n", m.MsgID, m.Queue, m.Offset, m.StoreTime.Format(time.RFC3339), m.BodySize)
				}
			})
		},
	}
	query.Flags().IntVar(&maxN, "max", 0, "most messages to return (default: the daemon's)")
	query.Flags().BoolVar(&unique, "unique", false, "KEY is a message id (UNIQ_KEY) rather than a business key")
	cmd.AddCommand(get, query)
	return cmd
}

func printPlugins(w io.Writer, ps ...control.PluginView) {
	nodes := slices.ContainsFunc(ps, func(p control.PluginView) bool { return len(p.Nodes) > 0 })
	if !nodes {
		fmt.Fprintln(w, "NAME\tVERSION\tKIND\tACTIVE")
	} else {
		fmt.Fprintln(w, "NAME\tVERSION\tKIND\tACTIVE\tNODES")
	}
	for _, p := range ps {
		if p.Manifest == nil {
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%t", p.Manifest.Name, p.Manifest.Version, p.Manifest.Kind, p.Active)
		if nodes {
			fmt.Fprintf(w, "\t%s", pluginNodes(p.Nodes))
		}
		fmt.Fprintln(w)
	}
}

// pluginNodes is a version's per-node column in a cluster: node=active, or node=refused
// (the reason is in the --json reply), comma-separated; "-" when no node reports it.
func pluginNodes(ns []control.PluginNode) string {
	if len(ns) == 0 {
		return "-"
	}
	parts := make([]string, len(ns))
	for i, n := range ns {
		state := "active"
		switch {
		case n.Error != "":
			state = "refused"
		case !n.Active:
			state = "inactive"
		}
		parts[i] = n.Node + "=" + state
	}
	return strings.Join(parts, ",")
}

func pluginCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "plugin", Short: "Deploy, list, activate and remove Wasm plugins of a running daemon"}
	o.addFlags(cmd)
	var activate bool
	deploy := &cobra.Command{
		Use: "deploy MODULE.wasm MANIFEST.json", Short: "Deploy a plugin version", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			mod, err := os.ReadFile(args[0])
			if err != nil {
				return fmt.Errorf("plugin deploy: %w", err)
			}
			man, err := os.ReadFile(args[1])
			if err != nil {
				return fmt.Errorf("plugin deploy: %w", err)
			}
			// The manifest must carry the module's digest; add it when the file has none.
			if man, err = withSHA256(man, mod); err != nil {
				return fmt.Errorf("plugin deploy: %s: %w", args[1], err)
			}
			req := control.PluginDeployRequest{Manifest: man, Module: base64.StdEncoding.EncodeToString(mod), Activate: activate}
			if req.Object, err = o.putLargeModule(cmd.Context(), man, mod, len(req.Module)+len(man)); err != nil {
				return fmt.Errorf("plugin deploy: %w", err)
			}
			if req.Object != "" {
				req.Module = ""
			}
			return call(cmd, o, "plugin.deploy", req, func(w io.Writer, r *control.PluginReply) { printPlugins(w, r.Plugin) })
		},
	}
	deploy.Flags().BoolVar(&activate, "activate", false, "make the version active once deployed")
	list := &cobra.Command{
		Use: "list [NAME[@VERSION]]", Short: "List plugin versions (of one plugin, or one version)", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var req control.PluginListRequest
			var version string
			if len(args) == 1 {
				req.Name, version, _ = strings.Cut(args[0], "@")
			}
			return call(cmd, o, "plugin.list", req, func(w io.Writer, r *control.PluginListReply) {
				ps := r.Plugins
				if version != "" {
					ps = slices.DeleteFunc(slices.Clone(ps), func(p control.PluginView) bool { return p.Manifest == nil || p.Manifest.Version != version })
				}
				printPlugins(w, ps...)
			})
		},
	}
	versionCmd := func(verb, short string) *cobra.Command {
		return &cobra.Command{
			Use: verb + " NAME@VERSION", Short: short, Args: nameVersionArgs,
			Long: short + `.

A version is named NAME@VERSION, as --wasm and pipeline selectors name one; the two
arguments NAME VERSION are accepted too.`,
			RunE: func(cmd *cobra.Command, args []string) error {
				name, ver := splitNameVersion(args)
				return call(cmd, o, "plugin."+verb, control.PluginVersionRequest{Name: name, Version: ver},
					func(w io.Writer, r *control.PluginReply) { printPlugins(w, r.Plugin) })
			},
		}
	}
	cmd.AddCommand(deploy, list, versionCmd("activate", "Make a deployed version the active one"),
		versionCmd("remove", "Delete a deployed version that is not active"))
	return cmd
}

// nameVersionArgs accepts a plugin version as NAME@VERSION, or as the two arguments NAME
// VERSION that plugin activate and remove took first.
func nameVersionArgs(_ *cobra.Command, args []string) error {
	ok := false
	switch len(args) {
	case 1:
		name, ver, found := strings.Cut(args[0], "@")
		ok = found && name != "" && ver != "" && !strings.Contains(ver, "@")
	case 2:
		ok = args[0] != "" && args[1] != "" && !strings.Contains(args[0], "@") && !strings.Contains(args[1], "@")
	}
	if !ok {
		return errors.New("want NAME@VERSION")
	}
	return nil
}

// splitNameVersion returns the name and version of arguments nameVersionArgs accepted.
func splitNameVersion(args []string) (name, version string) {
	if len(args) == 2 {
		return args[0], args[1]
	}
	name, version, _ = strings.Cut(args[0], "@")
	return name, version
}

// requestOverhead is what a plugin.deploy request adds to its module and manifest: the JSON
// around them and the NATS headers, with room to spare.
const requestOverhead = 4 << 10

// putLargeModule puts a module that does not fit in one request (the server's max_payload,
// 1 MiB by default: a Go plugin is about 2 MB) into the object store bucket the daemon reads
// modules from, creating the bucket when it does not exist, and returns the object's name
// ("<name>-<version>"). It returns "" for a module that fits.
func (o *clientOpts) putLargeModule(ctx context.Context, manifest, mod []byte, size int) (string, error) {
	nc, err := o.connect()
	if err != nil {
		return "", err
	}
	defer nc.Close()
	if int64(size+requestOverhead) <= nc.MaxPayload() {
		return "", nil
	}
	var m struct{ Name, Version string }
	if err := json.Unmarshal(manifest, &m); err != nil {
		return "", fmt.Errorf("manifest: %w", err)
	}
	if m.Name == "" || m.Version == "" {
		return "", errors.New("manifest: name and version are required")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return "", fmt.Errorf("module of %d bytes is over the request limit: jetstream: %w", len(mod), err)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	bucket, err := js.ObjectStore(ctx, control.PluginBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		bucket, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: control.PluginBucket, Description: "Wasm modules for flowd's plugin.deploy"})
	}
	if err != nil {
		return "", fmt.Errorf("module of %d bytes is over the request limit of %d: object store %s: %w", len(mod), nc.MaxPayload(), control.PluginBucket, err)
	}
	name := m.Name + "-" + m.Version
	if _, err := bucket.PutBytes(ctx, name, mod); err != nil {
		return "", fmt.Errorf("put %s into %s: %w", name, control.PluginBucket, err)
	}
	return name, nil
}
