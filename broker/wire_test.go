package broker_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// wireConn is one raw TCP connection to the broker on which the test writes frames byte by
// byte, as a client in another language would, and reads the responses by opaque.
type wireConn struct {
	t      *testing.T
	nc     net.Conn
	wmu    sync.Mutex
	mu     sync.Mutex
	next   int32
	wait   map[int32]chan *protocol.Command
	closed chan struct{} // closed when the broker closed the connection
}

func dialWire(t *testing.T, addr string) *wireConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	w := &wireConn{t: t, nc: nc, next: 100, wait: map[int32]chan *protocol.Command{}, closed: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(w.closed)
		br := bufio.NewReader(nc)
		for {
			resp, err := protocol.ReadFrame(br, 0)
			if err != nil {
				return
			}
			w.mu.Lock()
			ch := w.wait[resp.Opaque]
			delete(w.wait, resp.Opaque)
			w.mu.Unlock()
			if ch != nil {
				ch <- resp
			}
		}
	}()
	t.Cleanup(func() {
		_ = nc.Close()
		<-done
	})
	return w
}

// write sends a frame with the given JSON header text and body, and expects no answer.
func (w *wireConn) write(header string, body []byte) {
	w.t.Helper()
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)+len(body)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(header))) // JSON
	frame = append(append(frame, header...), body...)
	w.wmu.Lock()
	defer w.wmu.Unlock()
	_, err := w.nc.Write(frame)
	require.NoError(w.t, err)
}

// call sends a request with the given code and extFields (raw JSON text, values of any type)
// and returns where its response will arrive.
func (w *wireConn) call(code protocol.RequestCode, extFields string, body []byte) <-chan *protocol.Command {
	w.t.Helper()
	ch := make(chan *protocol.Command, 1)
	w.mu.Lock()
	w.next++
	opaque := w.next
	w.wait[opaque] = ch
	w.mu.Unlock()
	w.write(fmt.Sprintf(`{"code":%d,"language":"CPP","version":317,"opaque":%d,"flag":0,"extFields":%s}`, code, opaque, extFields), body)
	return ch
}

// answer waits for a response.
func (w *wireConn) answer(ch <-chan *protocol.Command, what string) *protocol.Command {
	w.t.Helper()
	select {
	case resp := <-ch:
		return resp
	case <-w.closed:
		w.t.Fatalf("the broker closed the connection before answering %s", what)
	case <-time.After(10 * time.Second):
		w.t.Fatalf("no answer to %s", what)
	}
	return nil
}

// invoke is call and answer.
func (w *wireConn) invoke(code protocol.RequestCode, extFields string, body []byte) *protocol.Command {
	w.t.Helper()
	return w.answer(w.call(code, extFields, body), code.String())
}

// served is invoke, again while the answer is SYSTEM_BUSY: a connection's in-flight slot is
// freed only after the response of the request holding it is written, so a client that sends
// its next request the moment it reads a response may find the slot still taken.
func (w *wireConn) served(code protocol.RequestCode, extFields string, body []byte) *protocol.Command {
	w.t.Helper()
	return whileBusy(w.t, func() *protocol.Command { return w.invoke(code, extFields, body) })
}

// whileBusy calls f until its answer is not SYSTEM_BUSY, for up to 5 s, on the test's
// goroutine (f may fail the test).
func whileBusy(t *testing.T, f func() *protocol.Command) *protocol.Command {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp := f()
		if resp.ResponseCode() != protocol.SystemBusy {
			return resp
		}
		if time.Now().After(deadline) {
			t.Fatalf("refused as busy for 5 s: %s", resp.Remark)
		}
		time.Sleep(time.Millisecond)
	}
}

// Other RocketMQ clients write header values as JSON numbers and booleans; the broker serves
// them as it serves strings.
func TestHeaderValuesOfAnyJSONType(t *testing.T) {
	b := startBroker(t, nil)
	w := dialWire(t, b.Addr())

	resp := w.invoke(protocol.SendMessage, `{"producerGroup":"p","topic":"numeric","defaultTopic":"TBW102",`+
		`"defaultTopicQueueNums":4,"queueId":0,"sysFlag":0,"bornTimestamp":1700000000000,"flag":0,`+
		`"properties":"TAGS\u0001a\u0002","reconsumeTimes":0,"unitMode":false,"batch":false,"maxReconsumeTimes":16}`, []byte("one"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var sent protocol.SendMessageResponseHeader
	require.NoError(t, resp.DecodeHeader(&sent))
	assert.Equal(t, int64(0), sent.QueueOffset)

	resp = w.invoke(protocol.SendMessageV2, `{"a":"p","b":"numeric","c":"TBW102","d":4,"e":0,"f":0,"g":1700000000001,"h":0,"j":0,"k":false,"m":false}`, []byte("two"))
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	require.Eventually(t, func() bool { return b.StoreMax("numeric", 0) == 2 }, 5*time.Second, 5*time.Millisecond)

	resp = w.invoke(protocol.PullMessage, `{"consumerGroup":"nums","topic":"numeric","queueId":0,"queueOffset":0,`+
		`"maxMsgNums":32,"sysFlag":4,"commitOffset":-1,"suspendTimeoutMillis":0,"subscription":"*","subVersion":0,"expressionType":"TAG","maxMsgBytes":null}`, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	msgs, err := protocol.DecodeStoredAll(resp.Body)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	assert.Equal(t, "one", string(msgs[0].Body))
	assert.Equal(t, "two", string(msgs[1].Body))

	resp = w.invoke(protocol.UpdateConsumerOffset, `{"consumerGroup":"nums","topic":"numeric","queueId":0,"commitOffset":2}`, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	require.Eventually(t, func() bool {
		off, ok := b.CommittedOffset("nums", "numeric", 0)
		return ok && off == 2
	}, 5*time.Second, 5*time.Millisecond)

	resp = w.invoke(protocol.QueryConsumerOffset, `{"consumerGroup":"nums","topic":"numeric","queueId":0,"setZeroIfNotFound":true}`, nil)
	require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	var off protocol.OffsetResponseHeader
	require.NoError(t, resp.DecodeHeader(&off))
	assert.Equal(t, int64(2), off.Offset)
}

// A request whose header cannot be read, or whose typed header fields are missing or do not
// parse, is answered with an error naming the problem, and the connection goes on serving.
func TestMalformedHeadersAreAnsweredAndTheConnectionKept(t *testing.T) {
	b := startBroker(t, nil)
	w := dialWire(t, b.Addr())
	const query = `{"consumerGroup":"g","topic":"kept","queueId":0,"setZeroIfNotFound":true}`

	for _, tc := range []struct {
		name, header, remark string
	}{
		{"syntax error after the opaque", `{"code":14,"opaque":7,"extFields":{"queueId":-}}`, `(key "queueId")`},
		{"wrong type of a header field", `{"code":14,"opaque":8,"flag":"0","extFields":{}}`, `header field "flag"`},
		{"extFields not an object", `{"code":14,"extFields":"queueId=0","opaque":9}`, `header field "extFields"`},
		{"typed field missing", `{"code":14,"opaque":10,"extFields":{"consumerGroup":"g","topic":"kept"}}`, `header field "queueId": missing`},
		{"typed field not a number", `{"code":14,"opaque":11,"extFields":{"consumerGroup":"g","topic":"kept","queueId":"zero"}}`, `header field "queueId"`},
		{"typed field not an integer", `{"code":14,"opaque":12,"extFields":{"consumerGroup":"g","topic":"kept","queueId":0.5}}`, `header field "queueId": "0.5"`},
		{"typed field of another type", `{"code":11,"opaque":13,"extFields":{"consumerGroup":"g","topic":"kept","queueId":[0]}}`, `header field "queueId": "[0]"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := make(chan *protocol.Command, 1)
			want := opaqueOf(t, tc.header)
			w.mu.Lock()
			w.wait[want] = ch
			w.mu.Unlock()
			w.write(tc.header, nil)
			resp := w.answer(ch, tc.name)
			assert.Equal(t, protocol.InvalidParameter, resp.ResponseCode())
			assert.Contains(t, resp.Remark, tc.remark)

			resp = w.invoke(protocol.QueryConsumerOffset, query, nil)
			assert.Equal(t, protocol.Success, resp.ResponseCode(), "the same connection still serves: %s", resp.Remark)
		})
	}

	// A header without a readable opaque cannot be answered; the connection still serves,
	// and the unknown serialize type of an intact frame does not close it either.
	w.write(`{"code":14,`, nil)
	w.wmu.Lock()
	_, err := w.nc.Write(append(binary.BigEndian.AppendUint32(nil, 6), 7, 0, 0, 2, '{', '}'))
	w.wmu.Unlock()
	require.NoError(t, err)
	resp := w.invoke(protocol.QueryConsumerOffset, query, nil)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	hb, err := (&protocol.HeartbeatData{ClientID: "raw-client"}).Encode()
	require.NoError(t, err)
	resp = w.invoke(protocol.HeartBeat, `{}`, hb)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
}

// opaqueOf finds the opaque in a test's hand-written header.
func opaqueOf(t *testing.T, header string) int32 {
	var n int32
	i := strings.Index(header, `"opaque":`)
	require.GreaterOrEqual(t, i, 0)
	_, err := fmt.Sscanf(header[i+len(`"opaque":`):], "%d", &n)
	require.NoError(t, err)
	return n
}

// A consumer keeps one parked long poll per queue on one connection. Parked pulls do not
// take the connection's in-flight slots, so its heartbeats, queries and commits are still
// served; beyond the parked bound a pull is answered at once instead of parking.
func TestParkedPullsDoNotStarveTheConnection(t *testing.T) {
	b := startBroker(t, func(c *broker.Config) {
		c.Transport = broker.TransportConfig{MaxInFlightPerConn: 1, MaxParkedPerConn: 4}
	})
	c := newRawClient(t, b, nil)
	c.send("parks", "first", "")
	require.Eventually(t, func() bool { return b.StoreMax("parks", 0) == 1 }, 5*time.Second, 5*time.Millisecond)

	w := dialWire(t, b.Addr())
	query := `{"consumerGroup":"g0","topic":"parks","queueId":"0","setZeroIfNotFound":"true"}`
	pull := func(group string) <-chan *protocol.Command {
		return w.call(protocol.PullMessage, `{"consumerGroup":"`+group+`","topic":"parks","queueId":"0","queueOffset":"1",`+
			`"maxMsgNums":"32","sysFlag":"6","commitOffset":"0","suspendTimeoutMillis":"20000","subscription":"*","subVersion":"0","expressionType":"TAG"}`, nil)
	}
	var parked []<-chan *protocol.Command
	for i := 0; i < 4; { // four times the in-flight bound
		ch := pull(fmt.Sprintf("g%d", i))
		// Until the pull parks it holds the one in-flight slot; then a query gets through.
		resp := w.served(protocol.QueryConsumerOffset, query, nil)
		require.Equal(t, protocol.Success, resp.ResponseCode(), "pull %d parked and freed its in-flight slot: %s", i, resp.Remark)
		// Responses arrive in the order the broker wrote them, so an answer to the pull
		// would be here by now. There is one only if the pull came while the slot was still
		// taken by the previous query: then send it again.
		select {
		case resp := <-ch:
			require.Equal(t, protocol.SystemBusy, resp.ResponseCode(), "pull %d answered instead of parking: %s", i, resp.Remark)
		default:
			parked = append(parked, ch)
			i++
		}
	}

	// The parked bound is reached: the next pull answers at once, not after its 20 s.
	resp := whileBusy(t, func() *protocol.Command { return w.answer(pull("g4"), "the pull beyond the parked bound") })
	assert.Equal(t, protocol.PullNotFound, resp.ResponseCode(), resp.Remark)

	// Control traffic on the same connection is served.
	hb, err := (&protocol.HeartbeatData{ClientID: "many-queues"}).Encode()
	require.NoError(t, err)
	resp = w.served(protocol.HeartBeat, `{}`, hb)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
	resp = w.served(protocol.UpdateConsumerOffset, `{"consumerGroup":"g0","topic":"parks","queueId":"0","commitOffset":"1"}`, nil)
	assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)

	// The parked pulls were really waiting: a message wakes each of them.
	c.send("parks", "second", "")
	for i, ch := range parked {
		resp := w.answer(ch, fmt.Sprintf("parked pull %d", i))
		require.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
		msgs, err := protocol.DecodeStoredAll(resp.Body)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		assert.Equal(t, "second", string(msgs[0].Body))
	}
}
