package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

const txTopic = "repl-tx"

// txListener commits the local transactions of bodies "commit-*", leaves those of "open-*"
// unknown, and answers every check-back with Commit, counting them.
type txListener struct {
	mu      sync.Mutex
	checked map[string]int
}

func (l *txListener) ExecuteLocal(_ context.Context, msg *producer.Message) producer.TxState {
	if string(msg.Body[:5]) == "open-" {
		return producer.TxUnknown
	}
	return producer.TxCommit
}

func (l *txListener) Check(_ context.Context, msg *producer.MessageExt) producer.TxState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checked[string(msg.Body)]++
	return producer.TxCommit
}

func (l *txListener) checks(body string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checked[body]
}

// What a failover keeps besides sends (docs/cluster.md, "Replica sets"): transactions the
// master committed are delivered by the next master; half messages it left open are
// checked back by the next master (the old one never asked: its first check was not due)
// and delivered once committed; a consumer group's offsets committed more than the
// snapshot interval (1 s) before the failover are the next master's exactly, and one
// committed just before it is either kept or lost, never moved elsewhere: the group reads
// again at most what it committed in that last second. Then a member of another
// store.segment_size tries to join the set, and is refused.
func TestReplicaSetFailoverKeepsTransactionsAndConsumerOffsets(t *testing.T) {
	nodes := startReplicaSetNet(t, "sync", nil, "--txn-first-check", "6s", "--txn-check-interval", "500ms")
	allInSync(t, nodes)
	old := masterAddr(nodes)
	m := nodeAt(nodes, old)
	require.NotNil(t, m)
	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	invoke := func(addr string, req *protocol.Command) (*protocol.Command, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := c.Invoke(ctx, addr, req)
		if err == nil && resp.ResponseCode() != protocol.Success {
			err = fmt.Errorf("%s: %s", resp.ResponseCode(), resp.Remark)
		}
		return resp, err
	}
	h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: txTopic, DefaultTopic: protocol.AutoCreateTopicKey,
		DefaultTopicQueueNums: 2, BornTimestamp: time.Now().UnixMilli()}
	_, err = invoke(old, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte("created")))
	require.NoError(t, err, "the topic is created by a first send")

	var namesrvs []string
	for _, n := range nodes {
		namesrvs = append(namesrvs, n.namesrv)
	}
	l := &txListener{checked: map[string]int{}}
	p, err := producer.New("e2e-tx", producer.WithTransactionListener(l), producer.WithClientOptions(
		client.WithNameServers(namesrvs...), client.WithRouteRefreshInterval(200*time.Millisecond), client.WithHeartbeatInterval(500*time.Millisecond)))
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, p.Start(ctx))
	defer p.Close(ctx)
	var committed, open []string
	for i := range 3 {
		for _, kind := range []string{"commit", "open"} {
			body := fmt.Sprintf("%s-%d", kind, i)
			res, err := p.SendInTransaction(ctx, &producer.Message{Topic: txTopic, Body: []byte(body)})
			require.NoError(t, err, body)
			if kind == "commit" {
				require.Equal(t, producer.TxCommit, res.State)
				committed = append(committed, body)
			} else {
				require.Equal(t, producer.TxUnknown, res.State)
				open = append(open, body)
			}
		}
	}

	// Offsets: queue 0's commit is older than the snapshot interval at the failover,
	// queue 1's is made just before it.
	commit := func(q int32, off int64) {
		t.Helper()
		u := &protocol.UpdateConsumerOffsetRequestHeader{ConsumerGroup: "e2e-cg", Topic: txTopic, QueueID: q, CommitOffset: off}
		_, err := invoke(old, protocol.NewRequestWith(protocol.UpdateConsumerOffset, u, nil))
		require.NoError(t, err)
	}
	commit(0, 2)
	for _, n := range nodes {
		require.Eventually(t, func() bool {
			got := topicAt(t, n.broker, txTopic)
			for _, b := range committed {
				if got[b] != 1 {
					return false
				}
			}
			return true
		}, wait, tick, "rs-%d holds the committed transactions", n.id)
	}
	time.Sleep(1500 * time.Millisecond) // past the snapshot interval
	commit(1, 2)
	require.Zero(t, l.checks(open[0]), "no check-back was due on the old master")
	m.kill()

	var cur string
	require.Eventually(t, func() bool {
		cur = masterAddr(nodes)
		if cur == "" || cur == old {
			return false
		}
		_, err := invoke(cur, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), []byte("after")))
		return err == nil
	}, wait, 100*time.Millisecond, "a replica took over")

	require.Eventually(t, func() bool {
		got := topicAt(t, cur, txTopic)
		for _, b := range append(append([]string(nil), committed...), open...) {
			if got[b] == 0 {
				return false
			}
		}
		return true
	}, wait, 100*time.Millisecond, "the new master delivers the committed transactions and those its check-backs committed")
	got := topicAt(t, cur, txTopic)
	for _, b := range append(append([]string(nil), committed...), open...) {
		require.Equal(t, 1, got[b], "%s delivered once", b)
	}
	for _, b := range open {
		require.Positive(t, l.checks(b), "%s was checked back by the new master", b)
	}

	query := func(q int32) int64 {
		zero := false
		qh := &protocol.QueryConsumerOffsetRequestHeader{ConsumerGroup: "e2e-cg", Topic: txTopic, QueueID: q, SetZeroIfNotFound: &zero}
		resp, err := invoke(cur, protocol.NewRequestWith(protocol.QueryConsumerOffset, qh, nil))
		if err != nil {
			return -1 // none committed
		}
		off, err := strconv.ParseInt(resp.ExtFields["offset"], 10, 64)
		require.NoError(t, err)
		return off
	}
	require.Equal(t, int64(2), query(0), "an offset committed before the snapshot interval survives the failover")
	q1 := query(1)
	require.Contains(t, []int64{-1, 2}, q1, "an offset committed just before the failover is kept or lost, nothing else")

	// Bad input on the same set: a fourth member of another segment size.
	oddMemberIsRefused(t, nodes[0], nodeAt(nodes, cur))
	t.Logf("offsets on the new master: queue 0 at 2 (committed 1.5 s before the kill), queue 1 at %d (committed just before it); check-backs: %v", q1, l.checked)
}
