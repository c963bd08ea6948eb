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

// printed runs print into a tabwriter as call does and returns the text.
func printed(print func(w *tabwriter.Writer)) string {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	print(tw)
	_ = tw.Flush()
	return buf.String()
}

// A gathered topic list names each topic's brokers, with the queue counts of a broker whose
// differ; a node's own list prints as it always has.
func TestPrintTopicList(t *testing.T) {
	r := &control.TopicListReply{
		Topics: []control.TopicView{{Topic: "orders", ReadQueues: 2, WriteQueues: 2, Perm: "rw", Kind: "user", Brokers: []control.TopicBrokerView{
			{Broker: "broker-1", ReadQueues: 2, WriteQueues: 2}, {Broker: "broker-2", ReadQueues: 4, WriteQueues: 4},
		}}},
		Coverage: control.Coverage{Answered: []string{"broker-1", "broker-2"}},
	}
	out := printed(func(w *tabwriter.Writer) { printTopicList(w, r) })
	assert.Regexp(t, `(?m)^TOPIC\s+READ\s+WRITE\s+PERM\s+ORDER\s+KIND\s+BROKERS$`, out)
	assert.Regexp(t, `(?m)^orders\s+2\s+2\s+rw\s+false\s+user\s+broker-1,broker-2:4/4$`, out)

	r.Coverage, r.Topics[0].Brokers = control.Coverage{}, nil
	out = printed(func(w *tabwriter.Writer) { printTopicList(w, r) })
	assert.Regexp(t, `(?m)^TOPIC\s+READ\s+WRITE\s+PERM\s+ORDER\s+KIND$`, out)
	assert.Regexp(t, `(?m)^orders\s+2\s+2\s+rw\s+false\s+user$`, out)
}

// A gathered group description names the broker of each queue and the brokers of each
// member.
func TestPrintGatheredGroup(t *testing.T) {
	one := int64(1)
	r := &control.GroupDescribeReply{
		Group: "billing", Configured: true, Lag: 7,
		Members: []control.MemberView{{ClientID: "c1", RemoteAddr: "10.0.0.5:1", LastHeartbeat: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Brokers: []string{"broker-1", "broker-2"}}},
		Topics: []control.GroupTopicView{{Topic: "orders", Lag: 7, Queues: []control.GroupQueueView{
			{Queue: 0, Committed: &one, MaxOffset: 3, Lag: 2, Owner: "c1", Broker: "broker-1"},
			{Queue: 0, MaxOffset: 5, Lag: 5, Broker: "broker-2"},
		}}},
		Coverage: control.Coverage{Answered: []string{"broker-1", "broker-2"}},
	}
	out := printed(func(w *tabwriter.Writer) { printGroup(w, r) })
	assert.Regexp(t, `(?m)^lag\s+7$`, out)
	assert.Regexp(t, `(?m)^c1\s+10\.0\.0\.5:1\s+2026-12-01T00:00:00Z\s+broker-1,broker-2$`, out)
	assert.Regexp(t, `(?m)^TOPIC\s+BROKER\s+QUEUE\s+COMMITTED\s+MAX OFFSET\s+LAG\s+OWNER$`, out)
	assert.Regexp(t, `(?m)^orders\s+broker-1\s+0\s+1\s+3\s+2\s+c1$`, out)
	assert.Regexp(t, `(?m)^orders\s+broker-2\s+0\s+-\s+5\s+5\s*$`, out)
}

// A gathered group list names each group's brokers.
func TestPrintGroupList(t *testing.T) {
	r := &control.GroupListReply{Groups: []control.GroupSummaryView{{Group: "billing", Members: 2, Lag: 9, Topics: []string{"orders"}, Brokers: []string{"broker-1", "broker-2"}}},
		Coverage: control.Coverage{Answered: []string{"broker-1", "broker-2"}}}
	out := printed(func(w *tabwriter.Writer) { printGroupList(w, r) })
	assert.Regexp(t, `(?m)^GROUP\s+CONFIGURED\s+MEMBERS\s+LAG\s+TOPICS\s+BROKERS$`, out)
	assert.Regexp(t, `(?m)^billing\s+false\s+2\s+9\s+orders\s+broker-1,broker-2$`, out)
	r.Coverage = control.Coverage{}
	out = printed(func(w *tabwriter.Writer) { printGroupList(w, r) })
	assert.Regexp(t, `(?m)^GROUP\s+CONFIGURED\s+MEMBERS\s+LAG\s+TOPICS$`, out)
}

// broker status prints one line per broker, the answering one marked.
func TestPrintBrokerStatus(t *testing.T) {
	a := control.StatusReply{Origin: control.Origin{Node: "broker-1"}, BrokerName: "broker-1", Addresses: control.Addresses{Broker: "10.0.0.1:10911"}, UptimeSeconds: 61.5, Topics: 5}
	b := control.StatusReply{Origin: control.Origin{Node: "broker-2"}, BrokerName: "broker-2", Addresses: control.Addresses{Broker: "10.0.0.2:10911"}, Store: control.StoreView{WriteFailure: "disk full"}}
	r := a
	r.Brokers = []control.StatusReply{a, b}
	out := printed(func(w *tabwriter.Writer) { printBrokerStatus(w, &r) })
	assert.Regexp(t, `(?m)^broker-1 \*\s+broker-1\s+10\.0\.0\.1:10911\s+-\s+1m1s\s+5\s+0\s+0\s+0\s+0\s+0\s+0\s+ok$`, out)
	assert.Regexp(t, `(?m)^broker-2\s+broker-2\s+10\.0\.0\.2:10911\s+.*failed: disk full$`, out)
	out = printed(func(w *tabwriter.Writer) { printBrokerStatus(w, &a) })
	assert.Regexp(t, `(?m)^broker-1 \*\s+broker-1\s+10\.0\.0\.1:10911\s`, out, "a single node: its own line")
}

// The nodes a gathered reply lacks are named with the reason; a complete reply warns of
// nothing.
func TestWarnMissing(t *testing.T) {
	raw, err := json.Marshal(control.TopicListReply{Coverage: control.Coverage{
		Answered: []string{"broker-1"}, Missing: []string{"broker-3"}, MissingReasons: map[string]string{"broker-3": "no answer within 2s"},
	}})
	require.NoError(t, err)
	var buf bytes.Buffer
	warnMissing(&buf, raw)
	assert.Equal(t, "warning: node broker-3 did not answer: no answer within 2s\nwarning: the answer covers broker-1 only\n", buf.String())
	buf.Reset()
	warnMissing(&buf, []byte(`{"node":"broker-1","answered":["broker-1"],"topics":[]}`))
	assert.Empty(t, buf.String())
}

// `flowd broker status` against a single node prints its broker; --local and --node-timeout
// are taken.
func TestBrokerStatusOfASingleNode(t *testing.T) {
	d := startServed(t, "")
	out, err := cli(t, "", "broker", "status", "--nats", d.nats, "--local", "--node-timeout", "1s")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^BROKER\s+NODE\s+ADDRESS\s+NAMESRV\s+UPTIME`, out)
	assert.Regexp(t, `(?m)^broker-a \*\s+broker-a\s+`+d.broker+`\s+`+d.namesrv+`\s`, out)
}

// A gathered cluster status ends with each node's own view.
func TestPrintClusterNodes(t *testing.T) {
	r := &control.ClusterStatusReply{Origin: control.Origin{Node: "broker-1"}, Clustered: true, Joined: true, Nodes: []control.ClusterNodeView{
		{Node: "broker-1", Joined: true, Brokers: []string{"broker-1", "broker-2"}, NATS: &control.NATSClusterView{Clustered: true, Routes: []string{"broker-2"}, MetaLeader: "broker-2"}},
		{Node: "broker-2", Joined: false, Brokers: []string{}},
	}}
	out := printed(func(w *tabwriter.Writer) { printClusterStatus(w, r, time.Now()) })
	assert.Regexp(t, `(?m)^NODE\s+JOINED\s+SEES\s+ROUTES\s+META LEADER$`, out)
	assert.Regexp(t, `(?m)^broker-1\s+true\s+broker-1,broker-2\s+broker-2\s+broker-2$`, out)
	assert.Regexp(t, `(?m)^broker-2\s+false\s+-\s+-\s+-$`, out)
}
