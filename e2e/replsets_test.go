package e2e

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/clientcore"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// setMember is one `flowd serve` of one of several replica sets in one NATS cluster.
type setMember struct {
	*daemon
	set  string // its broker name
	id   int    // its broker id
	args []string
}

// startReplicaSets starts size members (broker ids 1..size) of each broker name in one
// NATS cluster, async mode, all at once, and waits until each serves.
func startReplicaSets(t *testing.T, size int, names ...string) map[string][]*setMember {
	t.Helper()
	ports := freePorts(t, size*len(names))
	var routes []string
	for _, p := range ports {
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
	}
	out := map[string][]*setMember{}
	var all []*setMember
	for i, name := range names {
		for id := 1; id <= size; id++ {
			m := &setMember{set: name, id: id, args: []string{
				"--broker-name", name, "--replication", "async", "--broker-id", strconv.Itoa(id), "--ha-listen", "127.0.0.1:0",
				"--nats-cluster-listen", fmt.Sprintf("127.0.0.1:%d", ports[i*size+id-1]), "--nats-routes", strings.Join(routes, ","),
			}}
			m.daemon = launch(t, fmt.Sprintf("%s-%d", name, id), t.TempDir(), "", m.args...)
			out[name] = append(out[name], m)
			all = append(all, m)
		}
	}
	for _, m := range all {
		m.awaitServing()
	}
	return out
}

// routeOf asks the name service at namesrv for topic's route (GET_ROUTEINFO_BY_TOPIC) and
// returns each broker name's addresses by broker id; nil when it has no route.
func routeOf(namesrv, topic string) map[string]map[int64]string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{namesrv}})
	if err != nil {
		return nil
	}
	defer c.Close(context.Background())
	resp, err := c.Invoke(ctx, namesrv, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: topic}, nil))
	if err != nil || resp.ResponseCode() != protocol.Success {
		return nil
	}
	data, err := protocol.DecodeTopicRouteData(resp.Body)
	if err != nil {
		return nil
	}
	queues := map[string]bool{}
	for _, q := range data.QueueDatas {
		queues[q.BrokerName] = q.WriteQueueNums > 0
	}
	out := map[string]map[int64]string{}
	for _, bd := range data.BrokerDatas {
		if queues[bd.BrokerName] {
			out[bd.BrokerName] = bd.BrokerAddrs
		}
	}
	return out
}

// createTopicAt creates topic with queues queues on the broker at addr (UPDATE_AND_CREATE_TOPIC).
func createTopicAt(t *testing.T, addr, topic string, queues int32) {
	t.Helper()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	h := &protocol.CreateTopicRequestHeader{Topic: topic, ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite}
	resp, err := c.Invoke(ctx, addr, protocol.NewRequestWith(protocol.UpdateAndCreateTopic, h, nil))
	require.NoError(t, err)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

// storedBy is the broker address an offset message id names ("" if it names none).
func storedBy(offsetMsgID string) string {
	host, _, err := protocol.ParseOffsetMsgID(offsetMsgID)
	if err != nil {
		return ""
	}
	return host.String()
}

// grpcEndpoints is the gRPC route of topic at c: each broker's endpoint, by broker name,
// with two queues each ("" when the route names a broker at two endpoints).
func grpcEndpoints(t *testing.T, c pb.MessagingServiceClient, topic string) map[string]string {
	t.Helper()
	out, queues := map[string]string{}, map[string]int{}
	for _, q := range grpcRoute(t, c, topic) {
		if a, ok := out[q.broker]; ok && a != q.addr {
			q.addr = ""
		}
		out[q.broker] = q.addr
		queues[q.broker]++
	}
	for name, n := range queues {
		if n != 2 {
			out[name] = ""
		}
	}
	return out
}

// Two replica sets of two members each in one NATS cluster (four `flowd serve`, async
// mode): every member's name service routes a topic created on one set's master to both
// broker names, each with its master as id 0 and its replica by its broker id, and its gRPC
// route names both masters' endpoints; cluster.status lists both sets and both masters;
// flowd's producer, pointed at a replica, spreads its sends over both sets' masters, and a
// lite-pull group of two reads every message. Then one set's master is killed with SIGKILL:
// the routes (gRPC too) switch to its promoted replica, sends to both sets go on being
// acknowledged, and the group reads those too; restarted, the old master is routed as the
// set's replica 1.
func TestTwoReplicaSetsInOneClusterRouteEveryBrokerName(t *testing.T) {
	sets := startReplicaSets(t, 2, "rs-a", "rs-b")
	a1, a2, b1, b2 := sets["rs-a"][0], sets["rs-a"][1], sets["rs-b"][0], sets["rs-b"][1]
	members := []*setMember{a1, a2, b1, b2}
	// Id 1 starts each set as its first master; its replica is routed once in sync.
	want := map[string]map[int64]string{"rs-a": {0: a1.broker, 2: a2.broker}, "rs-b": {0: b1.broker, 2: b2.broker}}

	const topic = "sets-orders"
	require.Eventually(t, func() bool { return maps.Equal(routeOf(a1.namesrv, protocol.AutoCreateTopicKey)["rs-a"], want["rs-a"]) },
		wait, tick, "rs-a-1 is master with rs-a-2 in sync")
	createTopicAt(t, a1.broker, topic, 2)
	for _, m := range members {
		require.Eventually(t, func() bool {
			r := routeOf(m.namesrv, topic)
			return len(r) == 2 && maps.Equal(r["rs-a"], want["rs-a"]) && maps.Equal(r["rs-b"], want["rs-b"])
		}, wait, tick, "%s routes %s to both sets, master 0 and replica 2: %v", m.name, topic, routeOf(m.namesrv, topic))
	}

	// gRPC routes likewise: both sets' queues, each at its master's endpoint.
	grpcWant := func(a, b *setMember) map[string]string { return map[string]string{"rs-a": a.grpc, "rs-b": b.grpc} }
	for _, m := range members {
		c := grpcClient(t, m.grpc)
		require.Eventually(t, func() bool { return maps.Equal(grpcEndpoints(t, c, topic), grpcWant(a1, b1)) }, wait, tick,
			"%s's gRPC route names both masters: %v", m.name, grpcEndpoints(t, c, topic))
	}

	// cluster.status, asked at a replica of the other set, lists both sets and both masters.
	var st control.ClusterStatusReply
	require.Eventually(t, func() bool {
		if b2.ctlJSON(&st, "cluster", "status") != nil || len(st.ReplicaSets) != 2 || len(st.Brokers) != 2 {
			return false
		}
		for _, s := range st.ReplicaSets {
			if len(s.Members) != 2 || s.Master != s.BrokerName+"-1" {
				return false
			}
		}
		return true
	}, wait, tick, "cluster.status lists both sets: %+v", st)
	for _, b := range st.Brokers {
		assert.Equal(t, b.Name+"-1", b.Master, "the registry's entry of %s names its master", b.Name)
		assert.EqualValues(t, 1, b.Epoch)
	}

	// The masters keep the Raft leaders of the registry's and the leases' streams off their
	// NATS servers, so that a master's death costs neither an election.
	nc, err := nats.Connect(b2.nats)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	leader := func(stream string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil || s.CachedInfo().Cluster == nil {
			return ""
		}
		return s.CachedInfo().Cluster.Leader
	}
	for _, stream := range []string{"KV_flowd_brokers", "KV_flowd_replica_sets"} {
		require.Eventually(t, func() bool { l := leader(stream); return l != "" && l != "rs-a-1" && l != "rs-b-1" }, wait, 100*time.Millisecond,
			"%s's leader is on no master's server: %s", stream, leader(stream))
	}

	p := newProducer(t, b2.namesrv, "sets-producer")
	first := bodies("first", 12)
	by := sendAll(t, p, topic, first)
	names := map[string]int{}
	for _, name := range by {
		names[name]++
	}
	assert.Equal(t, map[string]int{"rs-a": 6, "rs-b": 6}, names, "sends by broker name")

	got := newBodyCounts()
	startPullers(t, a2.namesrv, "sets-group", topic, 2, got)
	require.Eventually(t, func() bool { return got.has(first) }, wait, tick, "the group reads every message of both sets")

	// A sender keeps sending while rs-a's master is killed.
	var mu sync.Mutex
	acked := map[string]string{} // body -> the address of the broker that stored it
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			body := fmt.Sprintf("during-%04d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			res, err := p.Send(ctx, &producer.Message{Topic: topic, Body: []byte(body)})
			cancel()
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			mu.Lock()
			acked[body] = storedBy(res.OffsetMsgID)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}()
	ackedBy := func(addr string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range acked {
			if a == addr {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return ackedBy(a1.broker) > 0 && ackedBy(b1.broker) > 0 }, wait, tick, "sends reach both masters")

	a1.kill()
	killed := time.Now()
	var wg sync.WaitGroup
	switched := make([]time.Duration, 3)
	for i, m := range []*setMember{a2, b1, b2} {
		wg.Go(func() {
			for time.Since(killed) < wait {
				r := routeOf(m.namesrv, topic)
				if r["rs-a"][0] == a2.broker && maps.Equal(r["rs-b"], want["rs-b"]) {
					switched[i] = time.Since(killed)
					return
				}
				time.Sleep(tick)
			}
		})
	}
	wg.Wait()
	for i, m := range []*setMember{a2, b1, b2} {
		require.NotZero(t, switched[i], "%s routes rs-a to its promoted replica: %v", m.name, routeOf(m.namesrv, topic))
	}
	c := grpcClient(t, b2.grpc)
	require.Eventually(t, func() bool { return maps.Equal(grpcEndpoints(t, c, topic), grpcWant(a2, b1)) }, wait, tick,
		"rs-b-2's gRPC route names rs-a's new master: %v", grpcEndpoints(t, c, topic))
	before := ackedBy(a2.broker)
	require.Eventually(t, func() bool { return ackedBy(a2.broker) >= before+5 && ackedBy(b1.broker) > 0 }, wait, tick,
		"sends acknowledged by rs-a's new master")
	t.Logf("rs-a's master killed: the routes of rs-a-2, rs-b-1 and rs-b-2 named the promoted replica after %v; a send acknowledged by it after %v",
		switched, time.Since(killed).Round(time.Millisecond))
	close(stop)
	<-done

	// Every send the live masters acknowledged reaches the group (what rs-a's old master
	// acknowledged just before its death may be lost: async mode).
	mu.Lock()
	var live []string
	for body, addr := range acked {
		if addr != a1.broker {
			live = append(live, body)
		}
	}
	mu.Unlock()
	require.Eventually(t, func() bool { return got.has(live) }, wait, tick, "the group reads every message the live masters acknowledged")

	// The old master, restarted, follows the new one and is routed as replica 1 once in
	// sync. It may first cut a tail async mode lost and run again in place on new ports: its
	// address is that of its last "flowd serving" line.
	a1.daemon = launch(t, "rs-a-1 restarted", a1.dir, "", a1.args...)
	require.Eventually(t, func() bool {
		all := servingLine.FindAllStringSubmatch(a1.logs.String(), -1)
		if len(all) == 0 {
			return false
		}
		r := routeOf(b1.namesrv, topic)
		return maps.Equal(r["rs-a"], map[int64]string{0: a2.broker, 1: all[len(all)-1][1]})
	}, wait, tick, "rs-b-1 routes rs-a's old master as its replica 1: %v", routeOf(b1.namesrv, topic))
}
