package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// replicaSetOf is the set named rs in a cluster.status reply.
func replicaSetOf(st control.ClusterStatusReply) (control.ClusterReplicaSet, bool) {
	for _, s := range st.ReplicaSets {
		if s.BrokerName == "rs" {
			return s, true
		}
	}
	return control.ClusterReplicaSet{}, false
}

// fullRoute is the broker ids and addresses a name service lists for broker rs.
func fullRoute(namesrv string) map[int64]string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := clientcore.New(clientcore.Options{NameServers: []string{namesrv}})
	if err != nil {
		return nil
	}
	defer c.Close(context.Background())
	resp, err := c.Invoke(ctx, namesrv, protocol.NewRequestWith(protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: replTopic}, nil))
	if err != nil || resp.ResponseCode() != protocol.Success {
		return nil
	}
	data, err := protocol.DecodeTopicRouteData(resp.Body)
	if err != nil {
		return nil
	}
	for _, bd := range data.BrokerDatas {
		if bd.BrokerName == "rs" {
			return bd.BrokerAddrs
		}
	}
	return nil
}

// TestReplicaSetStatusRoutesAndReadsFromReplicas: three flowd processes, one replica set in
// async mode. cluster.status through a replica shows the set (master, epoch, members by
// broker id, in sync, lag); the routes list the master as id 0 and each replica by its id;
// a replica serves pulls, also once the master is killed, and cluster.status then shows
// the member that took over in the next epoch.
func TestReplicaSetStatusRoutesAndReadsFromReplicas(t *testing.T) {
	nodes := startReplicaSet(t, "async")
	allInSync(t, nodes)
	m := nodeAt(nodes, masterAddr(nodes))
	require.NotNil(t, m)
	var replicas []*replNode
	for _, n := range nodes {
		if n != m {
			replicas = append(replicas, n)
		}
	}
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	const n = 20
	for i := range n {
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: replTopic, DefaultTopic: protocol.AutoCreateTopicKey,
			DefaultTopicQueueNums: 2, QueueID: 0, BornTimestamp: time.Now().UnixMilli()}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		resp, err := c.Invoke(ctx, m.broker, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), fmt.Appendf(nil, "m-%d", i)))
		cancel()
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}

	want := map[int64]string{0: m.broker}
	for _, r := range replicas {
		want[int64(r.id)] = r.broker
	}
	require.Eventually(t, func() bool {
		for _, n := range nodes {
			if fmt.Sprint(fullRoute(n.namesrv)) != fmt.Sprint(want) {
				return false
			}
		}
		return true
	}, wait, tick, "every member's routes list the master as 0 and the replicas by id: %v", want)

	var st control.ClusterStatusReply
	require.Eventually(t, func() bool {
		st = control.ClusterStatusReply{}
		if replicas[0].ctlJSON(&st, "cluster", "status", "--local") != nil {
			return false
		}
		s, ok := replicaSetOf(st)
		if !ok || s.Master != fmt.Sprintf("rs-%d", m.id) || s.Epoch < 1 || len(s.Members) != 3 {
			return false
		}
		for i, mem := range s.Members {
			if mem.BrokerID != int64(i+1) || !mem.InSync || mem.Addr == "" {
				return false
			}
			if mem.Node != s.Master && (mem.Role != "replica" || !mem.Connected) {
				return false
			}
		}
		// The lease stream, as JetStream answered the member asked: a leader
		// and both other members' replicas current.
		ls := s.LeaseStream
		return ls != nil && ls.ReadBy == fmt.Sprintf("rs-%d", replicas[0].id) && ls.Whole && ls.Leader != "" && len(ls.Replicas) == 2
	}, wait, tick, "cluster.status shows the replica set and its lease stream whole: %+v", st.ReplicaSets)
	epoch := st.ReplicaSets[0].Epoch

	for _, r := range replicas {
		require.Eventually(t, func() bool { return len(bodiesAt(t, r.broker)) == n }, wait, tick, "replica %d serves pulls", r.id)
	}
	m.kill()
	got := bodiesAt(t, replicas[0].broker)
	require.Len(t, got, n, "with the master gone, a replica serves what it holds")

	require.Eventually(t, func() bool {
		st = control.ClusterStatusReply{}
		if replicas[0].ctlJSON(&st, "cluster", "status", "--local") != nil {
			return false
		}
		s, ok := replicaSetOf(st)
		return ok && s.Epoch > epoch && s.Master != fmt.Sprintf("rs-%d", m.id)
	}, wait, tick, "cluster.status shows the new master: %+v", st.ReplicaSets)
}
