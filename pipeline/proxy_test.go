package pipeline_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/protocol"
)

// startBrokerBehindProxy starts a broker whose routes send clients through a commitProxy (the
// name service is reached directly), so that a test can hold back or slow down the commits
// that clients send it.
func startBrokerBehindProxy(t testing.TB) (*broker.Broker, *commitProxy) {
	t.Helper()
	for attempt := 0; ; attempt++ {
		// A free port for the broker, so that the proxy knows where to forward: another
		// process may take it before the broker binds it, hence the attempts.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		listen := ln.Addr().String()
		require.NoError(t, ln.Close())
		px := startCommitProxy(t, listen)
		cfg := broker.Config{DataDir: t.TempDir(), Listen: listen, AdvertisedAddr: px.addr(), NamesrvListen: "127.0.0.1:0",
			Logger: quiet(), ClientExpiry: 10 * time.Second}
		cfg.Store.SegmentSize = 16 << 20
		b, err := broker.New(cfg)
		if err == nil {
			if err = b.Start(); err == nil {
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					require.NoError(t, b.Shutdown(ctx))
				})
				return b, px
			}
		}
		if attempt == 4 {
			require.NoError(t, err)
		}
	}
}

// commitProxy forwards loopback connections to a broker frame by frame. The consumer-offset
// updates (UPDATE_CONSUMER_OFFSET) it forwards are recorded per queue, and it can hold back
// those of one queue, or delay them all, as a broker slow to answer them would be. A frame
// held back is overtaken by the frames after it: remoting matches answers to requests by
// opaque, in any order.
type commitProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu        sync.Mutex
	conns     []net.Conn
	hold      proxyQueue    // the queue whose commits wait for gate, when gate is set
	gate      chan struct{} // closed by the release function of holdCommits
	held      chan int64    // the offset of every commit held back, as it is
	delay     time.Duration // every commit waits so long before it is forwarded
	committed map[proxyQueue]int64
}

type proxyQueue struct {
	topic string
	id    int32
}

func startCommitProxy(t testing.TB, target string) *commitProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &commitProxy{ln: ln, target: target, held: make(chan int64, 64), committed: map[proxyQueue]int64{}}
	px.wg.Add(1)
	go px.accept()
	t.Cleanup(func() {
		ln.Close()
		px.mu.Lock()
		for _, c := range px.conns {
			c.Close()
		}
		if px.gate != nil {
			close(px.gate)
			px.gate = nil
		}
		px.mu.Unlock()
		px.wg.Wait()
	})
	return px
}

func (px *commitProxy) addr() string { return px.ln.Addr().String() }

// holdCommits holds back the commits of topic's queue id until release is called.
func (px *commitProxy) holdCommits(topic string, id int) (release func()) {
	px.mu.Lock()
	defer px.mu.Unlock()
	gate := make(chan struct{})
	px.hold, px.gate = proxyQueue{topic, int32(id)}, gate
	var once sync.Once
	return func() {
		once.Do(func() {
			px.mu.Lock()
			defer px.mu.Unlock()
			if px.gate == gate {
				close(gate)
				px.gate = nil
			}
		})
	}
}

// delayCommits makes every commit wait d before it is forwarded.
func (px *commitProxy) delayCommits(d time.Duration) {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.delay = d
}

// committedOffset is the highest offset of topic's queue id forwarded to the broker, -1 if
// none.
func (px *commitProxy) committedOffset(topic string, id int) int64 {
	px.mu.Lock()
	defer px.mu.Unlock()
	if off, ok := px.committed[proxyQueue{topic, int32(id)}]; ok {
		return off
	}
	return -1
}

func (px *commitProxy) accept() {
	defer px.wg.Done()
	for {
		c, err := px.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", px.target)
		if err != nil {
			c.Close()
			continue
		}
		px.mu.Lock()
		px.conns = append(px.conns, c, up)
		px.mu.Unlock()
		px.wg.Add(2)
		go func() {
			defer px.wg.Done()
			_, _ = io.Copy(c, up)
			c.Close()
		}()
		go func() {
			defer px.wg.Done()
			px.forward(c, up)
			up.Close()
		}()
	}
}

// forward copies the frames read from c to up, holding back or delaying commits.
func (px *commitProxy) forward(c, up net.Conn) {
	var wmu sync.Mutex // frames go out whole, from this goroutine or a held frame's
	var pending sync.WaitGroup
	defer pending.Wait()
	write := func(frame []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		_, _ = up.Write(frame)
	}
	r := bufio.NewReader(c)
	for {
		var prefix [4]byte
		if _, err := io.ReadFull(r, prefix[:]); err != nil {
			return
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(prefix[:]))
		copy(frame, prefix[:])
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return
		}
		cmd, err := protocol.DecodeFrame(frame[4:])
		if err != nil || cmd.IsResponse() || cmd.RequestCode() != protocol.UpdateConsumerOffset {
			write(frame)
			continue
		}
		var h protocol.UpdateConsumerOffsetRequestHeader
		if err := cmd.DecodeHeader(&h); err != nil {
			write(frame)
			continue
		}
		px.mu.Lock()
		var gate chan struct{}
		if px.hold == (proxyQueue{h.Topic, h.QueueID}) {
			gate = px.gate
		}
		delay := px.delay
		px.mu.Unlock()
		if gate == nil && delay == 0 {
			px.record(h)
			write(frame)
			continue
		}
		if gate != nil {
			px.held <- h.CommitOffset
		}
		pending.Add(1)
		go func() {
			defer pending.Done()
			if gate != nil {
				<-gate
			}
			time.Sleep(delay) // the slow path being simulated
			px.record(h)
			write(frame)
		}()
	}
}

func (px *commitProxy) record(h protocol.UpdateConsumerOffsetRequestHeader) {
	px.mu.Lock()
	defer px.mu.Unlock()
	q := proxyQueue{h.Topic, h.QueueID}
	if off, ok := px.committed[q]; !ok || h.CommitOffset > off {
		px.committed[q] = h.CommitOffset
	}
}
