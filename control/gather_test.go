package control_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/control"
)

// registry is a cluster's registry of live brokers as every node's member reports it.
type registry struct {
	mu      sync.Mutex
	brokers []control.ClusterBroker
}

func (r *registry) ClusterMembership() control.ClusterMembership {
	r.mu.Lock()
	defer r.mu.Unlock()
	return control.ClusterMembership{Joined: true, Brokers: slices.Clone(r.brokers)}
}

func (r *registry) add(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.brokers = append(r.brokers, control.ClusterBroker{Name: name, Cluster: "local", Node: name})
}

// gnode is one node of a gathering test: its broker and its command service.
type gnode struct {
	b   *broker.Broker
	svc *control.Service
}

// gcluster is several nodes on one NATS server, each with its own broker, service and
// connection, sharing one registry, and a client connection.
type gcluster struct {
	t     *testing.T
	ns    *server.Server
	cl    *nats.Conn
	reg   *registry
	nodes map[string]*gnode
}

func startGathering(t *testing.T, names ...string) *gcluster {
	t.Helper()
	c := &gcluster{t: t, ns: startNATS(t), reg: &registry{}, nodes: map[string]*gnode{}}
	c.cl = connect(t, c.ns)
	for _, name := range names {
		c.reg.add(name)
	}
	for _, name := range names {
		b := startBroker(t, func(cfg *broker.Config) { cfg.BrokerName = name })
		svc, err := control.StartService(context.Background(), connect(t, c.ns), b, control.ServiceConfig{Logger: quiet(), Membership: c.reg})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, svc.Stop()) })
		c.nodes[name] = &gnode{b: b, svc: svc}
	}
	return c
}

// requestOn sends body on subject and returns the reply.
func (c *gcluster) requestOn(subject, body string) *nats.Msg {
	c.t.Helper()
	msg, err := c.cl.Request(subject, []byte(body), wait)
	require.NoError(c.t, err, subject)
	return msg
}

// okOn sends a command on subject that must succeed and decodes its reply into out; it
// returns the raw reply.
func (c *gcluster) okOn(subject, body string, out any) []byte {
	c.t.Helper()
	msg := c.requestOn(subject, body)
	require.Empty(c.t, msg.Header.Get(micro.ErrorCodeHeader), "%s %s: %s", subject, body, msg.Header.Get(micro.ErrorHeader))
	if out != nil {
		require.NoError(c.t, json.Unmarshal(msg.Data, out), string(msg.Data))
	}
	return msg.Data
}

// ok sends a command on the cluster's shared subject, which any node answers.
func (c *gcluster) ok(cmd, body string, out any) []byte {
	c.t.Helper()
	return c.okOn("flowd.ctl.v1.local."+cmd, body, out)
}

func (c *gcluster) createEverywhere(topic string, queues int) {
	c.t.Helper()
	for _, n := range c.nodes {
		require.NoError(c.t, n.b.CreateTopic(broker.TopicConfig{Name: topic, ReadQueueNums: queues, WriteQueueNums: queues, Perm: 6}))
	}
}

func topicNamed(t *testing.T, ts []control.TopicView, name string) control.TopicView {
	t.Helper()
	i := slices.IndexFunc(ts, func(v control.TopicView) bool { return v.Topic == name })
	require.GreaterOrEqual(t, i, 0, "topic %s listed: %+v", name, ts)
	return ts[i]
}

func brokersOf(v control.TopicView) []string {
	var out []string
	for _, b := range v.Brokers {
		out = append(out, b.Broker)
	}
	return out
}

// In a cluster, topic.list through any node is the union of every node's topics, each
// with the queues of every broker that has it; "local" and a node's own subject answer
// for that node alone, in a single node's shape.
func TestGatheredTopicListCoversEveryNode(t *testing.T) {
	c := startGathering(t, "broker-a", "broker-b", "broker-c")
	all := []string{"broker-a", "broker-b", "broker-c"}
	c.createEverywhere("orders", 2)
	require.NoError(t, c.nodes["broker-b"].b.CreateTopic(broker.TopicConfig{Name: "only-b", ReadQueueNums: 1, WriteQueueNums: 3, Perm: 6}))

	var list control.TopicListReply
	c.ok("topic.list", ``, &list)
	assert.Equal(t, all, list.Answered)
	assert.Empty(t, list.Missing)
	assert.True(t, slices.IsSortedFunc(list.Topics, func(x, y control.TopicView) int { return compareStrings(x.Topic, y.Topic) }))
	orders := topicNamed(t, list.Topics, "orders")
	assert.Equal(t, all, brokersOf(orders))
	for _, b := range orders.Brokers {
		assert.Equal(t, control.TopicBrokerView{Broker: b.Broker, Node: b.Broker, ReadQueues: 2, WriteQueues: 2, Perm: "rw"}, b)
	}
	onlyB := topicNamed(t, list.Topics, "only-b")
	assert.Equal(t, []control.TopicBrokerView{{Broker: "broker-b", Node: "broker-b", ReadQueues: 1, WriteQueues: 3, Perm: "rw"}}, onlyB.Brokers)
	assert.Equal(t, all, brokersOf(topicNamed(t, list.Topics, "TBW102")), "each broker's own topics, once")

	// Local: the answering node's topics alone, no coverage, no brokers.
	raw := c.ok("topic.list", `{"local":true}`, &list)
	assert.NotContains(t, string(raw), `"answered"`)
	assert.NotContains(t, string(raw), `"brokers"`)
	assert.Equal(t, list.Node == "broker-b", slices.ContainsFunc(list.Topics, func(v control.TopicView) bool { return v.Topic == "only-b" }), list.Node)

	// A node's own subject: that node alone, whatever the request says.
	raw = c.okOn(control.NodeSubject("local", "broker-b", "topic.list"), `{"local":false}`, &list)
	assert.Equal(t, "broker-b", list.Node)
	assert.NotContains(t, string(raw), `"answered"`)
	topicNamed(t, list.Topics, "only-b")

	// Discovery shows the node subjects of the gathered commands, marked.
	inbox := nats.NewInbox()
	sub, err := c.cl.SubscribeSync(inbox)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, c.cl.PublishRequest("$SRV.INFO.flowd", inbox, nil))
	var info micro.Info
	for info.Metadata["node"] != "broker-a" {
		m, err := sub.NextMsg(wait)
		require.NoError(t, err, "broker-a's INFO")
		require.NoError(t, json.Unmarshal(m.Data, &info))
	}
	nodeOnly := map[string]bool{}
	for _, ep := range info.Endpoints {
		if ep.Metadata["node_only"] == "true" {
			nodeOnly[ep.Subject] = true
		}
	}
	assert.Equal(t, map[string]bool{
		"flowd.ctl.v1.local.node.broker-a.topic.list":     true,
		"flowd.ctl.v1.local.node.broker-a.group.list":     true,
		"flowd.ctl.v1.local.node.broker-a.group.describe": true,
		"flowd.ctl.v1.local.node.broker-a.broker.status":  true,
		"flowd.ctl.v1.local.node.broker-a.cluster.status": true,
	}, nodeOnly)
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// group.describe gathered: every broker's queues of the group's topics, marked with their
// broker, the lags summed; a node that does not know the group still answered; a group no
// node knows is a 404.
func TestGatheredGroupDescribeSumsLagAcrossBrokers(t *testing.T) {
	c := startGathering(t, "broker-a", "broker-b", "broker-c")
	c.createEverywhere("orders", 2)
	for name, n := range map[string]int{"broker-a": 3, "broker-b": 5} {
		b := c.nodes[name].b
		send(t, b, newProducer(t, b), "orders", n)
		_, err := b.ResetOffsetsTo(context.Background(), "billing", "orders", map[int32]int64{0: 0, 1: 0})
		require.NoError(t, err)
	}

	var d control.GroupDescribeReply
	c.ok("group.describe", `{"group":"billing"}`, &d)
	assert.Equal(t, []string{"broker-a", "broker-b", "broker-c"}, d.Answered, "broker-c answered: it does not know the group")
	assert.Empty(t, d.Missing)
	assert.Equal(t, "billing", d.Group)
	assert.Equal(t, int64(8), d.Lag, "3 messages on broker-a, 5 on broker-b, none consumed")
	require.Len(t, d.Topics, 1)
	orders := d.Topics[0]
	assert.Equal(t, "orders", orders.Topic)
	assert.Equal(t, int64(8), orders.Lag)
	var queues []string
	var sum int64
	for _, q := range orders.Queues {
		queues = append(queues, q.Broker+":"+strconv.Itoa(int(q.Queue)))
		require.NotNil(t, q.Committed)
		assert.Equal(t, q.MaxOffset-*q.Committed, q.Lag)
		sum += q.MaxOffset
	}
	assert.Equal(t, []string{"broker-a:0", "broker-a:1", "broker-b:0", "broker-b:1"}, queues)
	assert.Equal(t, int64(8), sum)

	var gl control.GroupListReply
	c.ok("group.list", ``, &gl)
	assert.Equal(t, []string{"broker-a", "broker-b", "broker-c"}, gl.Answered)
	i := slices.IndexFunc(gl.Groups, func(g control.GroupSummaryView) bool { return g.Group == "billing" })
	require.GreaterOrEqual(t, i, 0, "%+v", gl.Groups)
	assert.Equal(t, control.GroupSummaryView{Group: "billing", Topics: []string{"orders"}, Lag: 8, Brokers: []string{"broker-a", "broker-b"}}, gl.Groups[i])
	raw := c.ok("group.list", `{"local":true}`, &gl)
	assert.NotContains(t, string(raw), `"brokers"`)

	var local control.GroupDescribeReply
	raw = c.okOn(control.NodeSubject("local", "broker-a", "group.describe"), `{"group":"billing"}`, &local)
	assert.Equal(t, int64(3), local.Lag, "broker-a's own")
	assert.NotContains(t, string(raw), `"broker"`)

	msg := c.requestOn("flowd.ctl.v1.local.group.describe", `{"group":"nobody"}`)
	assert.Equal(t, "404", msg.Header.Get(micro.ErrorCodeHeader))
	assert.Contains(t, msg.Header.Get(micro.ErrorHeader), "group nobody is known to no node")
	msg = c.requestOn(control.NodeSubject("local", "broker-c", "group.describe"), `{"group":"billing"}`)
	assert.Equal(t, "404", msg.Header.Get(micro.ErrorCodeHeader), "broker-c alone does not know it")
}

// broker.status gathered: one entry per node, by broker name; cluster.status gathered:
// each node's own view of the registry.
func TestGatheredStatusHasOneEntryPerNode(t *testing.T) {
	c := startGathering(t, "broker-a", "broker-b", "broker-c")
	all := []string{"broker-a", "broker-b", "broker-c"}
	var st control.StatusReply
	c.ok("broker.status", ``, &st)
	assert.Equal(t, all, st.Answered)
	var names []string
	for _, b := range st.Brokers {
		names = append(names, b.BrokerName)
		assert.Equal(t, b.BrokerName, b.Node)
		assert.Equal(t, c.nodes[b.BrokerName].b.Addr(), b.Addresses.Broker)
		assert.Empty(t, b.Brokers, "an entry is that node's own status")
	}
	assert.Equal(t, all, names)
	assert.Equal(t, st.Node, st.BrokerName, "the answering node's status at the top, as on a single node")

	var cs control.ClusterStatusReply
	c.ok("cluster.status", ``, &cs)
	assert.Equal(t, all, cs.Answered)
	require.Len(t, cs.Nodes, 3)
	for i, n := range cs.Nodes {
		assert.Equal(t, control.ClusterNodeView{Node: all[i], Joined: true, Brokers: all}, n)
	}
}

// A node of the registry that does not answer, because its service is not running or it
// stalls, is named in "missing" with the reason, and the others' answers come within the
// request's bound.
func TestGatheringNamesTheNodesThatDoNotAnswer(t *testing.T) {
	c := startGathering(t, "broker-a", "broker-b", "broker-c")
	c.createEverywhere("orders", 1)
	c.reg.add("broker-d") // registered, no service
	c.reg.add("broker-e") // registered, stalls
	stalled, err := c.cl.Subscribe(control.NodeSubject("local", "broker-e", ">"), func(*nats.Msg) {})
	require.NoError(t, err)
	defer stalled.Unsubscribe()
	require.NoError(t, c.cl.Flush())
	require.NoError(t, c.nodes["broker-c"].svc.Stop())

	check := func(cmd, body string, cov *control.Coverage) {
		t.Helper()
		// The service that stopped no longer answers the shared subject either: the reply
		// comes from broker-a or broker-b.
		assert.Equal(t, []string{"broker-a", "broker-b"}, cov.Answered, cmd)
		assert.Equal(t, []string{"broker-c", "broker-d", "broker-e"}, cov.Missing, cmd)
		assert.Contains(t, cov.MissingReasons["broker-c"], "no responders", cmd)
		assert.Contains(t, cov.MissingReasons["broker-d"], "no responders", cmd)
		assert.Equal(t, "no answer within 300ms", cov.MissingReasons["broker-e"], cmd)
	}
	var list control.TopicListReply
	c.ok("topic.list", `{"timeout":"300ms"}`, &list)
	check("topic.list", "", &list.Coverage)
	assert.Equal(t, []string{"broker-a", "broker-b"}, brokersOf(topicNamed(t, list.Topics, "orders")))

	var st control.StatusReply
	c.ok("broker.status", `{"timeout":"300ms"}`, &st)
	check("broker.status", "", &st.Coverage)
	assert.Len(t, st.Brokers, 2)

	b := c.nodes["broker-a"].b
	_, err = b.ResetOffsetsTo(context.Background(), "billing", "orders", map[int32]int64{0: 0})
	require.NoError(t, err)
	var d control.GroupDescribeReply
	c.ok("group.describe", `{"group":"billing","timeout":"300ms"}`, &d)
	check("group.describe", "", &d.Coverage)

	msg := c.requestOn("flowd.ctl.v1.local.group.describe", `{"group":"nobody","timeout":"300ms"}`)
	assert.Equal(t, "404", msg.Header.Get(micro.ErrorCodeHeader))
	assert.Contains(t, msg.Header.Get(micro.ErrorHeader), "nodes that did not answer: broker-c, broker-d, broker-e")
}

// The gathered commands take "local" and "timeout" on a single node too, answered in the
// single node's shape; a timeout out of range is a 400 naming it.
func TestGatherScopeOnASingleNode(t *testing.T) {
	e := start(t, nil)
	for _, body := range []string{``, `{"local":true}`, `{"timeout":"1s"}`} {
		raw := e.request("topic.list", body).Data
		assert.NotContains(t, string(raw), `"answered"`, body)
		assert.NotContains(t, string(raw), `"brokers"`, body)
		e.ok("broker.status", body, nil)
		e.ok("cluster.status", body, nil)
	}
	for _, body := range []string{`{"timeout":"0s"}`, `{"timeout":"2m"}`, `{"timeout":"soon"}`, `{"timeout":true}`} {
		assert.Contains(t, e.fail("topic.list", body, control.CodeBadRequest), `field "timeout"`, body)
	}
	assert.Contains(t, e.fail("group.describe", `{"group":"g","timeout":"-1s"}`, control.CodeBadRequest), `field "timeout"`)
	assert.Equal(t, "flowd.ctl.v1.east.node.broker=2Ea.topic.list", control.NodeSubject("east", "broker.a", "topic.list"), "a node name that is no subject token is escaped")
}

// setsView is a node's membership: the shared registry, and the replica sets it reads.
type setsView struct {
	reg  *registry
	sets []control.ClusterReplicaSet
}

func (v setsView) ClusterMembership() control.ClusterMembership {
	m := v.reg.ClusterMembership()
	m.ReplicaSets = v.sets
	return m
}

// A gathered cluster.status lists every replica set any node reads, whichever node answers:
// a plain node reads none, and of two views of one set the newer epoch's wins.
func TestGatheredClusterStatusListsEveryReplicaSet(t *testing.T) {
	ns := startNATS(t)
	reg := &registry{}
	setA1 := control.ClusterReplicaSet{BrokerName: "rs-a", Master: "rs-a-1", Epoch: 1, Members: []control.ClusterReplicaMember{{Node: "rs-a-1", BrokerID: 1}}}
	setA2 := control.ClusterReplicaSet{BrokerName: "rs-a", Master: "rs-a-2", Epoch: 2, Members: []control.ClusterReplicaMember{{Node: "rs-a-2", BrokerID: 2}}}
	setB := control.ClusterReplicaSet{BrokerName: "rs-b", Master: "rs-b-1", Epoch: 1, Members: []control.ClusterReplicaMember{{Node: "rs-b-1", BrokerID: 1}}}
	views := map[string][]control.ClusterReplicaSet{"plain": nil, "rs-a": {setA2}, "rs-b": {setA1, setB}}
	for _, name := range []string{"plain", "rs-a", "rs-b"} {
		reg.add(name)
	}
	for name, sets := range views {
		b := startBroker(t, func(cfg *broker.Config) { cfg.BrokerName = name })
		svc, err := control.StartService(context.Background(), connect(t, ns), b, control.ServiceConfig{Logger: quiet(), Membership: setsView{reg: reg, sets: sets}})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, svc.Stop()) })
	}
	cl := connect(t, ns)
	for range 6 { // any node answers: each must give the whole picture
		msg, err := cl.Request("flowd.ctl.v1.local.cluster.status", nil, wait)
		require.NoError(t, err)
		var cs control.ClusterStatusReply
		require.NoError(t, json.Unmarshal(msg.Data, &cs), string(msg.Data))
		assert.Equal(t, []control.ClusterReplicaSet{setA2, setB}, cs.ReplicaSets, "answered by %s", cs.Node)
	}
}
