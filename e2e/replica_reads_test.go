package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// TestConsumerReadsHistoryFromAReplicaAndFreshMessagesFromTheMaster: three flowd processes,
// one replica set with replication.replica_reads and a small store.memory_budget, so that
// most of a stored history lies "on disk". flowd's consumer, reading the history from the
// start, is steered to a replica by the master's answers (suggestWhichBrokerId) and back
// to the master once caught up: its ReadStats show the history read mostly from a replica
// and every message sent afterwards read from the master; every message is received
// exactly once, in order, per queue.
func TestConsumerReadsHistoryFromAReplicaAndFreshMessagesFromTheMaster(t *testing.T) {
	const (
		queues  = 2
		history = 120 // per queue, 1 KiB each: 240 KiB against a 40 % × 64 KiB budget
		fresh   = 20  // per queue, sent once the consumer caught up
	)
	nodes := startReplicaSet(t, "async", "--replica-reads", "--memory-budget", "64KiB")
	allInSync(t, nodes)
	m := nodeAt(nodes, masterAddr(nodes))
	require.NotNil(t, m)

	c, err := clientcore.New(clientcore.Options{NameServers: []string{"127.0.0.1:1"}})
	require.NoError(t, err)
	defer c.Close(context.Background())
	pad := strings.Repeat("x", 1<<10)
	send := func(q, i int) {
		t.Helper()
		h := &protocol.SendMessageRequestHeader{ProducerGroup: "e2e", Topic: replTopic, DefaultTopic: protocol.AutoCreateTopicKey,
			DefaultTopicQueueNums: queues, QueueID: int32(q), BornTimestamp: time.Now().UnixMilli()}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := c.Invoke(ctx, m.broker, protocol.NewRequest(protocol.SendMessageV2, h.EncodeV2(), fmt.Appendf(nil, "%d-%04d-%s", q, i, pad)))
		require.NoError(t, err)
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	}
	for i := range history {
		for q := range queues {
			send(q, i)
		}
	}
	// The master suggests a replica for the history once it knows one in sync (it reads
	// the set's members every lease_ttl), and the replicas hold the history.
	require.Eventually(t, func() bool {
		h := &protocol.PullMessageRequestHeader{ConsumerGroup: protocol.ReaderGroup, Topic: replTopic, QueueOffset: 0,
			MaxMsgNums: 8, Subscription: "*", ExpressionType: "TAG"}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := c.Invoke(ctx, m.broker, protocol.NewRequestWith(protocol.PullMessage, h, nil))
		if err != nil || resp.ResponseCode() != protocol.Success {
			return false
		}
		var rh protocol.PullMessageResponseHeader
		return resp.DecodeHeader(&rh) == nil && rh.SuggestWhichBrokerID > 0
	}, wait, tick, "the master suggests a replica for old messages")
	for _, n := range nodes {
		if n != m {
			require.Eventually(t, func() bool { return len(bodiesAt(t, n.broker)) == queues*history }, wait, tick, "replica %d holds the history", n.id)
		}
	}

	cons, err := consumer.NewLitePull("replica-readers", consumer.WithClientOptions(clientOpts(m.namesrv, "replica-reader")...),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(200*time.Millisecond),
		consumer.WithBrokerSuspend(time.Second))
	require.NoError(t, err)
	require.NoError(t, cons.Subscribe(replTopic, "*"))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	require.NoError(t, cons.Start(ctx))
	cancel()
	defer cons.Close(context.Background())

	var mu sync.Mutex
	got := map[int][]string{} // queue → bodies' "q-i" in the order received
	offs := map[int][]int64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ms, err := cons.Poll(context.Background())
			if errors.Is(err, consumer.ErrNotRunning) || cons.State() != consumer.Running {
				return
			}
			mu.Lock()
			for _, msg := range ms {
				got[msg.Queue.QueueID] = append(got[msg.Queue.QueueID], string(msg.Body[:6]))
				offs[msg.Queue.QueueID] = append(offs[msg.Queue.QueueID], msg.QueueOffset)
			}
			mu.Unlock()
		}
	}()
	received := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(got[0]) + len(got[1])
	}
	perMember := func() map[int64]consumer.ReadStat {
		out := map[int64]consumer.ReadStat{}
		for _, s := range cons.ReadStats() {
			require.Equal(t, "rs", s.BrokerName)
			out[s.BrokerID] = s
		}
		return out
	}

	require.Eventually(t, func() bool { return received() == queues*history }, wait, tick, "the history received")
	// Caught up: the replica sends the consumer back, and the master answers its pulls
	// (held there up to the 1 s suspend time).
	var atHistory map[int64]consumer.ReadStat
	require.Eventually(t, func() bool {
		atHistory = perMember()
		return atHistory[0].Pulls > 0 && len(atHistory) > 1
	}, wait, tick, "pulls answered by the master and a replica: %v", atHistory)
	var replicaMsgs int64
	for id, s := range atHistory {
		if id != 0 {
			replicaMsgs += s.Messages
		}
	}
	require.Greater(t, replicaMsgs, atHistory[0].Messages, "most of the history read from a replica: %v", atHistory)
	mark := perMember()
	require.Eventually(t, func() bool { return perMember()[0].Pulls > mark[0].Pulls+1 }, wait, tick, "the master answers the caught-up consumer")

	before := perMember()
	for i := history; i < history+fresh; i++ {
		for q := range queues {
			send(q, i)
		}
	}
	require.Eventually(t, func() bool { return received() == queues*(history+fresh) }, wait, tick, "the fresh messages received")
	after := perMember()
	t.Logf("reads by member: history %v, caught up %v, after the fresh messages %v", atHistory, before, after)
	require.Equal(t, int64(queues*fresh), after[0].Messages-before[0].Messages, "fresh messages read from the master: %v then %v", before, after)
	for id, s := range after {
		if id != 0 {
			require.Equal(t, before[id].Messages, s.Messages, "no fresh message from replica %d", id)
		}
	}

	mu.Lock()
	defer mu.Unlock()
	for q := range queues {
		require.Len(t, got[q], history+fresh, "queue %d", q)
		for i, b := range got[q] {
			require.Equal(t, fmt.Sprintf("%d-%04d", q, i), b, "queue %d, message %d: once each, in order", q, i)
			require.Equal(t, int64(i), offs[q][i])
		}
	}
}
