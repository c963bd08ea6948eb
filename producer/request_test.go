package producer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// respond runs a flowd responder until the test ends: a lite-pull consumer of topic whose
// every message is answered with "re:<body>" by Reply.
func respond(t *testing.T, b *broker.Broker, topic string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := consumer.NewLitePull(fmt.Sprint("responders-", seq.Add(1)), consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())), consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithPollTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	qs, err := c.FetchMessageQueues(ctx, topic)
	require.NoError(t, err)
	require.NoError(t, c.Assign(qs))
	p, err := producer.New("responders", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet()), client.WithInstanceName(fmt.Sprint("responder-", seq.Add(1)))))
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			msgs, err := c.Poll(ctx)
			if err != nil {
				continue
			}
			for _, m := range msgs {
				// The broker stores a reply and pushes it on the requester's connection. A
				// requester whose connection just dropped (rocketmq-client-go's sometimes does
				// under load, mid-frame) is not told, as with RocketMQ: the responder hears of
				// it and answers again once the requester has reconnected, within its timeout.
				var err error
				for deadline := time.Now().Add(5 * time.Second); ; {
					if _, err = p.Reply(ctx, m.Properties(), []byte("re:"+string(m.Body))); err == nil || ctx.Err() != nil || time.Now().After(deadline) {
						break
					}
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
				if err != nil && ctx.Err() == nil {
					t.Errorf("reply to %s: %v", m.Body, err)
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = c.Close(context.Background())
		_ = p.Close(context.Background())
	})
}

func TestRequestGetsTheRespondersReply(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "service", 2)
	respond(t, b, "service")
	p := newProducer(t, b)
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		body := fmt.Sprintf("q%d", i)
		reply, err := p.Request(ctx, &producer.Message{Topic: "service", Body: []byte(body), Tags: "t"})
		cancel()
		require.NoError(t, err, body)
		assert.Equal(t, "re:"+body, string(reply.Body))
		assert.Equal(t, protocol.ReplyTopic(b.Status().Cluster), reply.Topic)
		assert.NotEmpty(t, reply.Properties[protocol.PropertyCorrelationID])
	}
}

func TestRequestWithoutAResponderEndsWithTheContext(t *testing.T) {
	b := startBroker(t, nil)
	createTopic(t, b, "silent", 1)
	p := newProducer(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := p.Request(ctx, &producer.Message{Topic: "silent", Body: []byte("anyone?")})
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// The request was stored with its reply address, the cluster stamped by the broker.
	msgs := readAll(t, b, "silent", 1)
	require.Len(t, msgs, 1)
	assert.Equal(t, p.ClientID(), msgs[0].Property(protocol.PropertyReplyToClient))
	assert.NotEmpty(t, msgs[0].Property(protocol.PropertyCorrelationID))
	assert.NotEmpty(t, msgs[0].Property(protocol.PropertyMessageTTL))
	assert.Equal(t, b.Status().Cluster, msgs[0].Property(protocol.PropertyCluster))
}

func TestReplyRefusesAMessageThatIsNoRequestAndReportsAGoneRequester(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	_, err := p.Reply(context.Background(), map[string]string{"k": "v"}, []byte("x"))
	require.ErrorIs(t, err, producer.ErrNotARequest)

	_, err = p.Reply(context.Background(), map[string]string{
		protocol.PropertyCluster: b.Status().Cluster, protocol.PropertyReplyToClient: "gone@nowhere", protocol.PropertyCorrelationID: "c",
	}, []byte("x"))
	var be *producer.BrokerError
	require.True(t, errors.As(err, &be), "%v", err)
	assert.Equal(t, protocol.SystemError, be.Code)
	assert.Contains(t, be.Remark, "gone@nowhere")
}

func TestRequestOnAProducerNotStarted(t *testing.T) {
	b := startBroker(t, nil)
	p, err := producer.New("unstarted", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet())))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	_, err = p.Request(context.Background(), &producer.Message{Topic: "t", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNotStarted)
}
