package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/flowd-io/flowd/control"
)

// clusterCommand shows a node's view of the cluster (cluster.status).
func clusterCommand() *cobra.Command {
	o := &clientOpts{}
	cmd := &cobra.Command{Use: "cluster", Short: "Show the cluster of a running daemon: its live brokers and NATS servers"}
	o.addFlags(cmd)
	var scope scopeOpts
	status := &cobra.Command{
		Use:   "status",
		Short: "List the live brokers and the NATS cluster, as the answering node sees them",
		Long: `List the live brokers of the cluster's registry (name, node, addresses, version, load,
last heartbeat) and the NATS cluster (routes, JetStream meta leader and peers), as the node
that answers sees them, then each node's own view (whether it joined, the brokers its
registry copy lists, its NATS routes and meta leader): nodes that disagree show there, and a
node that did not answer is named in a warning. A single node lists itself alone,
"clustered: false".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, o, "cluster.status", scope.request(nil), func(w io.Writer, r *control.ClusterStatusReply) {
				printClusterStatus(w, r, time.Now())
			})
		},
	}
	scope.addFlags(status)
	cmd.AddCommand(status)
	return cmd
}

func printClusterStatus(w io.Writer, r *control.ClusterStatusReply, now time.Time) {
	fmt.Fprintf(w, "node\t%s\ncluster\t%s\nclustered\t%t\njoined\t%t\n", r.Node, r.Cluster, r.Clustered, r.Joined)
	fmt.Fprintln(w, "\nBROKER\tNODE\tADDRESS\tNAMESRV\tVERSION\tSTARTED\tHEARTBEAT\tTOPICS\tCLIENTS\tWAITING PULLS")
	for _, b := range r.Brokers {
		name := b.Name
		if b.Self {
			name += " *"
		}
		hb := "-"
		if b.Heartbeat != nil {
			hb = now.Sub(*b.Heartbeat).Round(100*time.Millisecond).String() + " ago"
		}
		node := b.Node
		if b.Master != "" {
			node = fmt.Sprintf("%s (replica set master, epoch %d)", b.Master, b.Epoch)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", name, node, b.Addr, orDash(b.Namesrv), orDash(b.Version),
			b.Started.Format(time.RFC3339), hb, b.Load.Topics, b.Load.Clients, b.Load.WaitingPulls)
	}
	printReplicaSets(w, r.ReplicaSets)
	defer printClusterNodes(w, r.Nodes)
	n := r.NATS
	if n == nil {
		return
	}
	fmt.Fprintf(w, "\nnats cluster\t%s\nnats server\t%s\n", orDash(n.Name), orDash(n.ServerName))
	if !n.Clustered {
		return
	}
	fmt.Fprintf(w, "route listener\t%s\nroutes\t%s\nmeta leader\t%s\n", orDash(n.RouteURL), orDash(strings.Join(n.Routes, ",")), orDash(n.MetaLeader))
	if n.Error != "" {
		fmt.Fprintf(w, "error\t%s\n", n.Error)
	}
	if len(n.Peers) > 0 {
		fmt.Fprintln(w, "\nPEER\tCURRENT\tOFFLINE")
		for _, p := range n.Peers {
			fmt.Fprintf(w, "%s\t%t\t%t\n", p.Name, p.Current, p.Offline)
		}
	}
}

// printReplicaSets lists each replica set's members: role, broker id, in-sync flag and
// the lag the master last published.
func printReplicaSets(w io.Writer, sets []control.ClusterReplicaSet) {
	for _, s := range sets {
		fmt.Fprintf(w, "\nreplica set\t%s\nmaster\t%s\nepoch\t%d\n", s.BrokerName, orDash(s.Master), s.Epoch)
		fmt.Fprintln(w, "MEMBER\tBROKER ID\tROLE\tADDRESS\tIN SYNC\tLAG BYTES\tLAG TIME")
		for _, m := range s.Members {
			lagB, lagT := "-", "-"
			if m.Connected {
				lagB, lagT = fmt.Sprint(m.LagBytes), (time.Duration(m.LagMillis) * time.Millisecond).String()
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%t\t%s\t%s\n", m.Node, m.BrokerID, m.Role, m.Addr, m.InSync, lagB, lagT)
		}
		if ls := s.LeaseStream; ls != nil {
			fmt.Fprintf(w, "lease stream\t%s (read by %s)\n", leaseStreamLine(ls), ls.ReadBy)
		}
	}
}

// leaseStreamLine says whether the lease stream is whole, its leader, and each follower:
// current or not, when the leader last heard from it, how far behind it is.
func leaseStreamLine(ls *control.ClusterLeaseStream) string {
	if ls.Error != "" {
		return "unreadable: " + ls.Error
	}
	state := "whole"
	if !ls.Whole {
		state = "not whole"
	}
	parts := []string{fmt.Sprintf("%s, leader %s", state, orDash(ls.Leader))}
	for _, p := range ls.Replicas {
		f := "current"
		switch {
		case p.Offline:
			f = "offline"
		case !p.Current:
			f = "not current"
		}
		f = fmt.Sprintf("%s %s, heard from %s ago", p.Name, f, time.Duration(p.ActiveMillis)*time.Millisecond)
		if p.Lag > 0 {
			f += fmt.Sprintf(", %d entries behind", p.Lag)
		}
		parts = append(parts, f)
	}
	return strings.Join(parts, "; ")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
