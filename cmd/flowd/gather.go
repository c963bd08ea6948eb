package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/control"
)

// scopeOpts are the flags of the commands a cluster answers for every node: the answering
// node alone, or how long it waits for the others.
type scopeOpts struct {
	local   bool
	timeout time.Duration
}

func (s *scopeOpts) addFlags(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&s.local, "local", false, "the answering node's own answer, not the cluster's")
	cmd.Flags().DurationVar(&s.timeout, "node-timeout", 0, "how long the answering node waits for the others (default: the daemon's, 2s; keep it under --timeout)")
}

// request is the command's request: fields, and the scope's "local" and "timeout".
func (s *scopeOpts) request(fields map[string]any) map[string]any {
	req := maps.Clone(fields)
	if req == nil {
		req = map[string]any{}
	}
	if s.local {
		req["local"] = true
	}
	if s.timeout > 0 {
		req["timeout"] = s.timeout.String()
	}
	return req
}

// warnMissing tells, on w, which nodes a gathered reply lacks: what it prints is then not
// the whole cluster's.
func warnMissing(w io.Writer, raw []byte) {
	var cov control.Coverage
	if json.Unmarshal(raw, &cov) != nil || len(cov.Missing) == 0 {
		return
	}
	for _, node := range cov.Missing {
		fmt.Fprintf(w, "warning: node %s did not answer: %s\n", node, orDash(cov.MissingReasons[node]))
	}
	fmt.Fprintf(w, "warning: the answer covers %s only\n", strings.Join(cov.Answered, ", "))
}

// printTopicList prints topic.list; a gathered list names each topic's brokers, with the
// queue counts of a broker whose differ from the topic's.
func printTopicList(w io.Writer, r *control.TopicListReply) {
	if len(r.Answered) == 0 {
		printTopics(w, r.Topics...)
		return
	}
	fmt.Fprintln(w, "TOPIC\tREAD\tWRITE\tPERM\tORDER\tKIND\tBROKERS")
	for _, t := range r.Topics {
		var brokers []string
		for _, b := range t.Brokers {
			name := b.Broker
			if b.ReadQueues != t.ReadQueues || b.WriteQueues != t.WriteQueues {
				name += fmt.Sprintf(":%d/%d", b.ReadQueues, b.WriteQueues)
			}
			brokers = append(brokers, name)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%t\t%s\t%s\n", t.Topic, t.ReadQueues, t.WriteQueues, t.Perm, t.Order, t.Kind, strings.Join(brokers, ","))
	}
}

// printGroupList prints group.list; a gathered list names the brokers that know each group.
func printGroupList(w io.Writer, r *control.GroupListReply) {
	gathered := len(r.Answered) > 0
	header := "GROUP\tCONFIGURED\tMEMBERS\tLAG\tTOPICS"
	if gathered {
		header += "\tBROKERS"
	}
	fmt.Fprintln(w, header)
	for _, g := range r.Groups {
		line := fmt.Sprintf("%s\t%t\t%d\t%d\t%s", g.Group, g.Configured, g.Members, g.Lag, strings.Join(g.Topics, ","))
		if gathered {
			line += "\t" + strings.Join(g.Brokers, ",")
		}
		fmt.Fprintln(w, line)
	}
}

// printGroup prints group.describe; a gathered one names the broker of each queue and the
// brokers each member is on.
func printGroup(w io.Writer, r *control.GroupDescribeReply) {
	gathered := len(r.Answered) > 0
	fmt.Fprintf(w, "group\t%s\nconfigured\t%t\nlag\t%d\n", r.Group, r.Configured, r.Lag)
	if len(r.Members) > 0 {
		if gathered {
			fmt.Fprintln(w, "\nMEMBER\tADDRESS\tLAST HEARTBEAT\tBROKERS")
		} else {
			fmt.Fprintln(w, "\nMEMBER\tADDRESS\tLAST HEARTBEAT")
		}
		for _, m := range r.Members {
			line := fmt.Sprintf("%s\t%s\t%s", m.ClientID, m.RemoteAddr, m.LastHeartbeat.Format(time.RFC3339))
			if gathered {
				line += "\t" + strings.Join(m.Brokers, ",")
			}
			fmt.Fprintln(w, line)
		}
	}
	if gathered {
		fmt.Fprintln(w, "\nTOPIC\tBROKER\tQUEUE\tCOMMITTED\tMAX OFFSET\tLAG\tOWNER")
	} else {
		fmt.Fprintln(w, "\nTOPIC\tQUEUE\tCOMMITTED\tMAX OFFSET\tLAG\tOWNER")
	}
	for _, t := range r.Topics {
		for _, q := range t.Queues {
			committed := "-"
			if q.Committed != nil {
				committed = strconv.FormatInt(*q.Committed, 10)
			}
			topic := t.Topic
			if gathered {
				topic += "\t" + q.Broker
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\t%s\n", topic, q.Queue, committed, q.MaxOffset, q.Lag, q.Owner)
		}
	}
}

// brokerCommand shows the brokers' status (broker.status).
func brokerCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "broker", Short: "Show the status of a running daemon's broker, or of every broker of its cluster"}
	o.addFlags(cmd)
	var scope scopeOpts
	status := &cobra.Command{
		Use:   "status",
		Short: "Show each broker's addresses, uptime, load and store",
		Long: `Show each broker's addresses, uptime, counts (topics, groups, clients, members, locked
queues, waiting pulls) and commit log. In a cluster the answering node asks every live node
and prints one line per broker; a node that did not answer is named in a warning.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, o, "broker.status", scope.request(nil), func(w io.Writer, r *control.StatusReply) { printBrokerStatus(w, r) })
		},
	}
	scope.addFlags(status)
	cmd.AddCommand(status)
	return cmd
}

func printBrokerStatus(w io.Writer, r *control.StatusReply) {
	brokers := r.Brokers
	if len(brokers) == 0 {
		brokers = []control.StatusReply{*r}
	}
	fmt.Fprintln(w, "BROKER\tNODE\tADDRESS\tNAMESRV\tUPTIME\tTOPICS\tGROUPS\tCLIENTS\tMEMBERS\tLOCKED\tWAITING PULLS\tCOMMIT LOG\tSTORE")
	for _, b := range brokers {
		name := b.BrokerName
		if b.Node == r.Node {
			name += " *"
		}
		store := "ok"
		if b.Store.WriteFailure != "" {
			store = "failed: " + b.Store.WriteFailure
		}
		uptime := (time.Duration(b.UptimeSeconds) * time.Second).String()
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", name, b.Node, b.Addresses.Broker, orDash(b.Addresses.Namesrv), uptime,
			b.Topics, b.Groups, b.Clients, b.Members, b.LockedQueues, b.WaitingPulls, b.Store.CommitLogMaxOffset, store)
	}
}

// printClusterNodes prints each node's own view of a gathered cluster.status.
func printClusterNodes(w io.Writer, nodes []control.ClusterNodeView) {
	if len(nodes) == 0 {
		return
	}
	fmt.Fprintln(w, "\nNODE\tJOINED\tSEES\tROUTES\tMETA LEADER")
	for _, n := range nodes {
		routes, leader := "-", "-"
		if n.NATS != nil {
			routes, leader = orDash(strings.Join(n.NATS.Routes, ",")), orDash(n.NATS.MetaLeader)
		}
		fmt.Fprintf(w, "%s\t%t\t%s\t%s\t%s\n", n.Node, n.Joined, orDash(strings.Join(n.Brokers, ",")), routes, leader)
	}
}
