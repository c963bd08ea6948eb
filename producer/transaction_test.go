package producer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/producer"
	"github.com/flowd-io/flowd/protocol"
)

// txListener decides local transactions by body; check answers check-backs.
type txListener struct {
	mu       sync.Mutex
	local    map[string]producer.TxState
	check    producer.TxState
	executed []string
	checked  []*producer.MessageExt
}

func (l *txListener) ExecuteLocal(_ context.Context, m *producer.Message) producer.TxState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.executed = append(l.executed, string(m.Body))
	return l.local[string(m.Body)]
}

func (l *txListener) Check(_ context.Context, m *producer.MessageExt) producer.TxState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checked = append(l.checked, m)
	return l.check
}

func (l *txListener) checkedMsgs() []*producer.MessageExt {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*producer.MessageExt(nil), l.checked...)
}

func fastChecks(cfg *broker.Config) {
	cfg.TransactionTimeout = 50 * time.Millisecond
	cfg.TransactionCheckInterval = 20 * time.Millisecond
}

func TestSendInTransactionCommitsAndRollsBack(t *testing.T) {
	b := startBroker(t, nil)
	qs := createTopic(t, b, "tx", 1)
	l := &txListener{local: map[string]producer.TxState{"yes": producer.TxCommit, "no": producer.TxRollback}}
	p := newProducer(t, b, producer.WithTransactionListener(l))

	res, err := p.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Tags: "t", Keys: []string{"k1"}, Body: []byte("yes")})
	require.NoError(t, err)
	assert.Equal(t, producer.TxCommit, res.State)
	assert.Equal(t, res.MsgID, res.TransactionID)
	res, err = p.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Body: []byte("no")})
	require.NoError(t, err)
	assert.Equal(t, producer.TxRollback, res.State)
	assert.Equal(t, []string{"yes", "no"}, l.executed)

	msgs := rawPull(t, b, qs[0], 0, 1)
	require.Len(t, msgs, 1)
	assert.Equal(t, "yes", string(msgs[0].Body))
	assert.Equal(t, "t", msgs[0].Tags())
	assert.Equal(t, "k1", msgs[0].Properties[protocol.PropertyKeys])
	assert.Zero(t, b.PendingTransactions())
	// The rollback stored nothing after it: a normal send is the queue's second message.
	sres, err := p.Send(context.Background(), &producer.Message{Topic: "tx", Body: []byte("plain")})
	require.NoError(t, err)
	assert.Equal(t, int64(1), sres.QueueOffset)
}

func TestSendInTransactionUnknownIsCheckedBack(t *testing.T) {
	b := startBroker(t, fastChecks)
	qs := createTopic(t, b, "tx", 1)
	l := &txListener{local: map[string]producer.TxState{}, check: producer.TxCommit}
	p := newProducer(t, b, producer.WithTransactionListener(l))
	res, err := p.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Body: []byte("later")})
	require.NoError(t, err)
	assert.Equal(t, producer.TxUnknown, res.State)

	msgs := rawPull(t, b, qs[0], 0, 1)
	require.Len(t, msgs, 1)
	assert.Equal(t, "later", string(msgs[0].Body))
	checked := l.checkedMsgs()
	require.NotEmpty(t, checked)
	assert.Equal(t, "tx", checked[0].Topic)
	assert.Equal(t, res.MsgID, checked[0].Properties[protocol.PropertyUniqueKey])
	require.Eventually(t, func() bool { return b.PendingTransactions() == 0 }, wait, time.Millisecond)
}

func TestSendInTransactionNeedsAListener(t *testing.T) {
	b := startBroker(t, nil)
	p := newProducer(t, b)
	_, err := p.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Body: []byte("x")})
	require.ErrorIs(t, err, producer.ErrNotTransactional)
	_, err = producer.New("g", producer.WithClientOptions(client.WithNameServers("127.0.0.1:1")), producer.WithTransactionListener(nil))
	require.ErrorIs(t, err, producer.ErrInvalidOption)
	pt := newProducer(t, b, producer.WithTransactionListener(&txListener{}))
	_, err = pt.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Body: []byte("x"), DelayLevel: 1})
	require.ErrorIs(t, err, producer.ErrInvalidMessage)
	assert.Zero(t, b.PendingTransactions())
}

// A check-back whose listener says Unknown leaves the message pending; the broker asks
// until its limit and then drops it.
func TestTransactionCheckedUnknownUntilDiscarded(t *testing.T) {
	b := startBroker(t, func(cfg *broker.Config) {
		fastChecks(cfg)
		cfg.TransactionCheckMax = 3
	})
	discarded := make(chan broker.Event, 1)
	cancel := b.Subscribe(func(e broker.Event) {
		if e.Type == broker.TransactionDiscarded {
			discarded <- e
		}
	})
	defer cancel()
	createTopic(t, b, "tx", 1)
	l := &txListener{local: map[string]producer.TxState{}, check: producer.TxUnknown}
	p := newProducer(t, b, producer.WithTransactionListener(l))
	res, err := p.SendInTransaction(context.Background(), &producer.Message{Topic: "tx", Body: []byte("never")})
	require.NoError(t, err)
	select {
	case e := <-discarded:
		assert.Equal(t, res.QueueOffset, e.Offset)
	case <-time.After(wait):
		t.Fatal("not discarded")
	}
	require.Eventually(t, func() bool { return len(l.checkedMsgs()) == 3 }, wait, time.Millisecond)
	assert.Zero(t, b.StoreMax("tx", 0))
}
