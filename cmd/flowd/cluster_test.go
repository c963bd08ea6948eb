package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// `flowd cluster status` against a single node lists that node's broker alone, marked as
// the one answering, with "clustered" false; --json prints the reply.
func TestClusterStatusOfASingleNode(t *testing.T) {
	d := startServed(t, "")
	ctl := []string{"--nats", d.nats}

	out, err := cli(t, "", append([]string{"cluster", "status"}, ctl...)...)
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^clustered\s+false$`, out)
	assert.Regexp(t, `(?m)^joined\s+false$`, out)
	assert.Regexp(t, `(?m)^BROKER\s+NODE\s+ADDRESS\s+NAMESRV\s+VERSION\s+STARTED\s+HEARTBEAT`, out)
	assert.Regexp(t, `(?m)^broker-a \*\s+broker-a\s+`+d.broker+`\s+`+d.namesrv+`\s`, out)
	assert.Regexp(t, `(?m)^nats server\s+flowd$`, out, "a standalone server")

	out, err = cli(t, "", append([]string{"cluster", "status", "--json"}, ctl...)...)
	require.NoError(t, err)
	var st control.ClusterStatusReply
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	assert.False(t, st.Clustered)
	require.Len(t, st.Brokers, 1)
	assert.Equal(t, d.broker, st.Brokers[0].Addr)
	require.NotNil(t, st.NATS)
	assert.False(t, st.NATS.Clustered)
}

// The table shows each broker's heartbeat age and load, and the NATS cluster's routes,
// meta leader and peers.
func TestPrintClusterStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 2, 20, 31, 0, time.UTC)
	hb := now.Add(-1500 * time.Millisecond)
	r := &control.ClusterStatusReply{
		Origin: control.Origin{Node: "broker-1", Cluster: "local"}, Clustered: true, Joined: true,
		Brokers: []control.ClusterBroker{
			{Name: "broker-1", Node: "n1", Addr: "10.0.0.1:10911", Namesrv: "10.0.0.1:9876", Version: "1.0", Started: now.Add(-time.Hour), Heartbeat: &hb, Self: true, Load: control.ClusterLoad{Topics: 5, Clients: 2, WaitingPulls: 3}},
			{Name: "broker-2", Node: "n2", Addr: "10.0.0.2:10911", Started: now.Add(-time.Hour), Heartbeat: &hb},
		},
		NATS: &control.NATSClusterView{Clustered: true, Name: "east", ServerName: "broker-1", RouteURL: "nats-route://10.0.0.1:6222",
			Routes: []string{"broker-2"}, MetaLeader: "broker-2",
			Peers: []control.NATSClusterPeer{{Name: "broker-1", Current: true}, {Name: "broker-2", Current: true}}},
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	printClusterStatus(tw, r, now)
	require.NoError(t, tw.Flush())
	out := buf.String()
	assert.Regexp(t, `(?m)^broker-1 \*\s+n1\s+10\.0\.0\.1:10911\s+10\.0\.0\.1:9876\s+1\.0\s+2026-12-01T01:20:31Z\s+1\.5s ago\s+5\s+2\s+3$`, out)
	assert.Regexp(t, `(?m)^broker-2\s+n2\s+10\.0\.0\.2:10911\s+-\s+-\s+`, out)
	assert.Regexp(t, `(?m)^routes\s+broker-2$`, out)
	assert.Regexp(t, `(?m)^meta leader\s+broker-2$`, out)
	assert.Regexp(t, `(?m)^PEER\s+CURRENT\s+OFFLINE$`, out)
	assert.Regexp(t, `(?m)^broker-1\s+true\s+false$`, out)
}

// The table lists each replica set: its master and epoch, and every member with its broker
// id, role, in-sync flag and, for a connected replica, its lag.
func TestPrintClusterStatusReplicaSets(t *testing.T) {
	r := &control.ClusterStatusReply{
		Origin: control.Origin{Node: "rs", Cluster: "local"}, Clustered: true,
		Brokers: []control.ClusterBroker{{Name: "rs", Node: "rs", Addr: "10.0.0.2:10911", Master: "rs-2", Epoch: 3}},
		ReplicaSets: []control.ClusterReplicaSet{{BrokerName: "rs", Master: "rs-2", Epoch: 3, InSync: []string{"rs-1"},
			Members: []control.ClusterReplicaMember{
				{Node: "rs-1", BrokerID: 1, Role: "replica", Addr: "10.0.0.1:10911", InSync: true, Connected: true, LagBytes: 4096, LagMillis: 250},
				{Node: "rs-2", BrokerID: 2, Role: "master", Addr: "10.0.0.2:10911", InSync: true},
				{Node: "rs-3", BrokerID: 3, Role: "replica", Addr: "10.0.0.3:10911"},
			},
			LeaseStream: &control.ClusterLeaseStream{ReadBy: "rs-2", Leader: "rs-1", Replicas: []control.ClusterStreamPeer{
				{Name: "rs-2", Current: true, ActiveMillis: 120}, {Name: "rs-3", ActiveMillis: 4100, Lag: 7}}},
		}},
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	printClusterStatus(tw, r, time.Now())
	require.NoError(t, tw.Flush())
	out := buf.String()
	assert.Regexp(t, `(?m)^rs\s+rs-2 \(replica set master, epoch 3\)\s+10\.0\.0\.2:10911\s`, out, "the registry's entry of a set names its master")
	assert.Regexp(t, `(?m)^replica set\s+rs$`, out)
	assert.Regexp(t, `(?m)^master\s+rs-2$`, out)
	assert.Regexp(t, `(?m)^epoch\s+3$`, out)
	assert.Regexp(t, `(?m)^rs-1\s+1\s+replica\s+10\.0\.0\.1:10911\s+true\s+4096\s+250ms$`, out)
	assert.Regexp(t, `(?m)^rs-2\s+2\s+master\s+10\.0\.0\.2:10911\s+true\s+-\s+-$`, out)
	assert.Regexp(t, `(?m)^rs-3\s+3\s+replica\s+10\.0\.0\.3:10911\s+false\s+-\s+-$`, out)
	assert.Regexp(t, `(?m)^lease stream\s+not whole, leader rs-1; rs-2 current, heard from 120ms ago; rs-3 not current, heard from 4\.1s ago, 7 entries behind \(read by rs-2\)$`, out)
}
