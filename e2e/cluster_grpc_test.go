package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flowd-io/flowd/control"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// grpcClient is a generated client of a node's gRPC endpoint.
func grpcClient(t *testing.T, addr string) pb.MessagingServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return pb.NewMessagingServiceClient(conn)
}

// grpcCtx is a call context with the headers a RocketMQ 5 client sends.
func grpcCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return metadata.AppendToOutgoingContext(ctx, "x-mq-client-id", "e2e-grpc", "x-mq-protocol", "v2")
}

// routeQueue is one queue of a gRPC route: its broker, that broker's endpoint and its id.
type routeQueue struct {
	broker, addr string
	id           int32
}

func grpcRoute(t *testing.T, c pb.MessagingServiceClient, topic string) []routeQueue {
	t.Helper()
	resp, err := c.QueryRoute(grpcCtx(t), &pb.QueryRouteRequest{Topic: &pb.Resource{Name: topic}})
	require.NoError(t, err)
	if resp.Status.Code != pb.Code_OK {
		return nil // not created on this node yet
	}
	var out []routeQueue
	for _, q := range resp.MessageQueues {
		require.Equal(t, pb.Permission_READ_WRITE, q.Permission)
		as := q.Broker.Endpoints.Addresses
		require.Len(t, as, 1)
		out = append(out, routeQueue{broker: q.Broker.Name, addr: net.JoinHostPort(as[0].Host, strconv.Itoa(int(as[0].Port))), id: q.Id})
	}
	return out
}

// receiveAll pops what the group has at the node's endpoint until a receive comes back empty,
// acknowledging each, and returns the bodies.
func receiveAll(t *testing.T, c pb.MessagingServiceClient, topic, group string) []string {
	t.Helper()
	var got []string
	for {
		stream, err := c.ReceiveMessage(grpcCtx(t), &pb.ReceiveMessageRequest{
			Group: &pb.Resource{Name: group}, MessageQueue: &pb.MessageQueue{Topic: &pb.Resource{Name: topic}},
			FilterExpression: &pb.FilterExpression{Type: pb.FilterType_TAG, Expression: "*"}, BatchSize: 32,
			InvisibleDuration: durationpb.New(30 * time.Second), LongPollingTimeout: durationpb.New(time.Second),
		})
		require.NoError(t, err)
		var batch []*pb.Message
		for {
			r, err := stream.Recv()
			if err != nil {
				break // the stream ends after its status
			}
			if m := r.GetMessage(); m != nil {
				batch = append(batch, m)
			}
		}
		if len(batch) == 0 {
			slices.Sort(got)
			return got
		}
		var acks []*pb.AckMessageEntry
		for _, m := range batch {
			got = append(got, string(m.Body))
			acks = append(acks, &pb.AckMessageEntry{MessageId: m.SystemProperties.MessageId, ReceiptHandle: m.SystemProperties.GetReceiptHandle()})
		}
		resp, err := c.AckMessage(grpcCtx(t), &pb.AckMessageRequest{Group: &pb.Resource{Name: group}, Topic: &pb.Resource{Name: topic}, Entries: acks})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
	}
}

// Three `flowd serve` nodes, two with a gRPC endpoint and one with it off: a gRPC route asked
// at either gRPC node lists the topic's queues on both, each under its broker with that
// node's gRPC address, and leaves out the node a 5.x client cannot reach. A send to each
// queue's endpoint is stored on that node, and a receive on a node hands out that node's
// messages only; the Node.js client producing through one node spreads its sends over both,
// and its simple and push consumers pointed at either node receive every message of both.
func TestClusterGRPCRoutesNameEveryNode(t *testing.T) {
	nodes := startClusterWith(t, map[string][]string{"broker-3": {"--grpc-listen", "off"}}, "broker-1", "broker-2", "broker-3")
	a, b := nodes[0], nodes[1]
	awaitJoined(t, nodes, "broker-1", "broker-2", "broker-3")
	require.Equal(t, "off", nodes[2].grpc)
	// cluster.status shows each broker's gRPC address from the registry.
	var st control.ClusterStatusReply
	require.NoError(t, b.ctlJSON(&st, "cluster", "status"))
	grpcOf := map[string]string{}
	for _, br := range st.Brokers {
		grpcOf[br.Name] = br.GRPC
	}
	assert.Equal(t, map[string]string{"broker-1": a.grpc, "broker-2": b.grpc, "broker-3": ""}, grpcOf)
	const topic = "grpc-orders"
	a.ctl("topic", "create", topic, "--queues", "2")

	want := []routeQueue{{"broker-1", a.grpc, 0}, {"broker-1", a.grpc, 1}, {"broker-2", b.grpc, 0}, {"broker-2", b.grpc, 1}}
	ca, cb := grpcClient(t, a.grpc), grpcClient(t, b.grpc)
	for _, c := range []pb.MessagingServiceClient{ca, cb} {
		var got []routeQueue
		require.Eventually(t, func() bool {
			got = grpcRoute(t, c, topic)
			slices.SortFunc(got, cmpRoute)
			return slices.Equal(got, want)
		}, wait, 50*time.Millisecond, "the gRPC route lists both gRPC nodes' queues: last %v", got)
	}

	// A send to each queue's endpoint, as a 5.x producer makes it, is stored on that node.
	clients := map[string]pb.MessagingServiceClient{a.grpc: ca, b.grpc: cb}
	sentTo := map[string][]string{}
	for i, q := range want {
		body := fmt.Sprintf("%s-q%d-%d", q.broker, q.id, i)
		qid := q.id
		m := &pb.Message{Topic: &pb.Resource{Name: topic}, Body: []byte(body), SystemProperties: &pb.SystemProperties{
			MessageId: fmt.Sprintf("01E2E%06d", i), MessageType: pb.MessageType_NORMAL, BodyEncoding: pb.Encoding_IDENTITY, QueueId: qid,
		}}
		resp, err := clients[q.addr].SendMessage(grpcCtx(t), &pb.SendMessageRequest{Messages: []*pb.Message{m}})
		require.NoError(t, err)
		require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
		sentTo[q.broker] = append(sentTo[q.broker], body)
	}
	// A receive on a node reads that node's queues: each node hands out what was sent to it.
	assert.Equal(t, sentTo["broker-1"], receiveAll(t, ca, topic, "g-go"), "received at broker-1")
	assert.Equal(t, sentTo["broker-2"], receiveAll(t, cb, topic, "g-go"), "received at broker-2")

	// The Node.js client: its producer round-robins over queue 0 of each broker of the route,
	// its simple consumer over the same queues, so it receives at every node.
	var msgs []map[string]any
	var bodies []string
	for i := range 8 {
		bodies = append(bodies, fmt.Sprintf("node-%02d", i))
		msgs = append(msgs, map[string]any{"body": bodies[i]})
	}
	runNodeClient(t, b.grpc, map[string]any{"mode": "produce", "topic": topic, "messages": msgs})
	// A new group reads the topic from its start: the Go sends too.
	all := append(append(slices.Clone(sentTo["broker-1"]), sentTo["broker-2"]...), bodies...)
	slices.Sort(all)
	got := runNodeClient(t, a.grpc, map[string]any{"mode": "simple", "topic": topic, "group": "g-node", "count": len(all), "awaitMs": 1000})
	require.Equal(t, all, got, "the Node.js consumer at broker-1 receives every message of both nodes")
	// Its push consumer is assigned queue 0 of each node (QueryAssignment) and receives at both.
	got = runNodeClient(t, b.grpc, map[string]any{"mode": "push", "topic": topic, "group": "g-push", "count": len(all)})
	require.Equal(t, all, dedup(got), "the Node.js push consumer at broker-2 receives every message of both nodes")
	onA, onB := receiveAll(t, ca, topic, "g-count"), receiveAll(t, cb, topic, "g-count")
	assert.NotEmpty(t, withPrefix(onA, "node-"), "the Node.js producer's sends reach broker-1")
	assert.NotEmpty(t, withPrefix(onB, "node-"), "the Node.js producer's sends reach broker-2")
	assert.Len(t, append(withPrefix(onA, "node-"), withPrefix(onB, "node-")...), len(bodies))
}

func cmpRoute(x, y routeQueue) int {
	return cmp.Or(strings.Compare(x.broker, y.broker), cmp.Compare(x.id, y.id))
}

func withPrefix(s []string, prefix string) []string {
	var out []string
	for _, v := range s {
		if strings.HasPrefix(v, prefix) {
			out = append(out, v)
		}
	}
	return out
}

// dedup is sorted s without repeats: a push consumer may be handed a message again.
func dedup(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// In a replica set every member's gRPC route names the set's queues under broker id 0 with
// the master's gRPC endpoint, replicas' included, so that a 5.x client pointed at a replica
// sends (and receives) at the master; a send there is stored.
func TestReplicaSetGRPCRoutesNameTheMaster(t *testing.T) {
	nodes := startReplicaSet(t, "async")
	allInSync(t, nodes)
	m := nodeAt(nodes, masterAddr(nodes))
	require.NotNil(t, m)
	// Created on the master by a remoting send (a control-plane command lands on any member);
	// the replicas get it with the master's snapshots.
	const topic = "grpc-rs"
	produceIDs(t, m.namesrv, topic, "seed")
	var want []routeQueue
	require.Eventually(t, func() bool { want = grpcRoute(t, grpcClient(t, m.grpc), topic); return len(want) > 0 }, wait, 50*time.Millisecond)
	for _, q := range want {
		require.Equal(t, routeQueue{"rs", m.grpc, q.id}, q, "the master names itself")
	}
	for _, n := range nodes {
		c := grpcClient(t, n.grpc)
		var got []routeQueue
		require.Eventually(t, func() bool {
			got = grpcRoute(t, c, topic)
			return slices.Equal(got, want)
		}, wait, 50*time.Millisecond, "rs-%d's gRPC route names the master rs-%d: last %v", n.id, m.id, got)
		if n != m {
			// What a client that asked this replica does: send to the endpoint its route names.
			msg := &pb.Message{Topic: &pb.Resource{Name: topic}, Body: []byte(fmt.Sprintf("via-rs-%d", n.id)), SystemProperties: &pb.SystemProperties{
				MessageId: fmt.Sprintf("01E2ERS%05d", n.id), MessageType: pb.MessageType_NORMAL, BodyEncoding: pb.Encoding_IDENTITY,
			}}
			resp, err := grpcClient(t, got[0].addr).SendMessage(grpcCtx(t), &pb.SendMessageRequest{Messages: []*pb.Message{msg}})
			require.NoError(t, err)
			require.Equal(t, pb.Code_OK, resp.Status.Code, resp.Status.Message)
		}
	}
	// The replicas' own endpoints refuse sends: the route is what sends them to the master.
	for _, n := range nodes {
		if n == m {
			continue
		}
		msg := &pb.Message{Topic: &pb.Resource{Name: topic}, Body: []byte("direct"), SystemProperties: &pb.SystemProperties{
			MessageId: "01E2ERSDIRECT", MessageType: pb.MessageType_NORMAL, BodyEncoding: pb.Encoding_IDENTITY,
		}}
		resp, err := grpcClient(t, n.grpc).SendMessage(grpcCtx(t), &pb.SendMessageRequest{Messages: []*pb.Message{msg}})
		require.NoError(t, err)
		assert.Equal(t, pb.Code_HA_NOT_AVAILABLE, resp.Status.Code, "a send at replica rs-%d", n.id)
		break
	}
	others := otherIDs(nodes, m)
	assert.Equal(t, []string{"seed", "via-rs-" + strconv.Itoa(others[0]), "via-rs-" + strconv.Itoa(others[1])},
		receiveAll(t, grpcClient(t, m.grpc), topic, "g-rs"), "the sends through both replicas' routes stored on the master")
}

// otherIDs are the broker ids of the members other than m, in order.
func otherIDs(nodes []*replNode, m *replNode) []int {
	var out []int
	for _, n := range nodes {
		if n != m {
			out = append(out, n.id)
		}
	}
	return out
}
