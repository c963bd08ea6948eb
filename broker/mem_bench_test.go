package broker_test

import (
	"bufio"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// The memory a broker holds per idle connection and per parked pull, measured as the growth
// of the process's heap and goroutine stacks (runtime.MemStats after a GC) over many of them
// on a real broker on 127.0.0.1. The client side is raw sockets in the same process: a
// net.Conn each, a few hundred bytes, counted in the figures (they err high, not low).
//
// Targets: at most 64 KiB per idle connection, at most 2 KiB per parked pull, heap and
// goroutine stacks counted together (B/conn, B/parked-pull). Run with
//
//	go test -run '^$' -bench 'Memory' -benchtime 1x ./broker/

// memInUse is the heap in use plus goroutine stacks, after a collection.
type memInUse struct{ heap, stack uint64 }

func readMem() memInUse {
	runtime.GC()
	runtime.GC() // the first may leave finalizer-freed objects
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memInUse{heap: ms.HeapAlloc, stack: ms.StackInuse}
}

// rawConn is a client connection without a client library: it writes request frames and
// reads response frames, and holds nothing else.
type rawConn struct {
	nc     net.Conn
	br     *bufio.Reader
	opaque int32
}

func dialRaw(tb testing.TB, addr string) *rawConn {
	nc, err := net.Dial("tcp", addr)
	require.NoError(tb, err)
	return &rawConn{nc: nc, br: bufio.NewReaderSize(nc, 512)}
}

func (c *rawConn) write(tb testing.TB, code protocol.RequestCode, h protocol.Header, body []byte) {
	c.opaque++
	cmd := protocol.NewRequestWith(code, h, body)
	cmd.Opaque = c.opaque
	frame, err := cmd.AppendFrame(nil)
	require.NoError(tb, err)
	_, err = c.nc.Write(frame)
	require.NoError(tb, err)
}

func (c *rawConn) read(tb testing.TB) *protocol.Command {
	require.NoError(tb, c.nc.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := protocol.ReadFrame(c.br, 16<<20)
	require.NoError(tb, err)
	return resp
}

// BenchmarkIdleConnMemory opens connections to a broker, has each send requests the way a
// client starts (a route query; then, in the burst case, 16 at once, as a client pipelining
// sends does), waits for the answers, and reports the memory the idle connections hold.
func BenchmarkIdleConnMemory(b *testing.B) {
	for _, tc := range []struct {
		name  string
		conns int
		burst int
	}{
		{"conns=1000/requests=1", 1000, 1},
		{"conns=1000/burst=16", 1000, 16},
	} {
		b.Run(tc.name, func(b *testing.B) {
			br := startBroker(b, nil)
			warm := dialRaw(b, br.Addr()) // the broker's own first-use allocations, outside the delta
			warm.write(b, protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "mem"}, nil)
			warm.read(b)
			var perConn, heapPerConn, stackPerConn float64
			for range b.N {
				before := readMem()
				goroutines := runtime.NumGoroutine()
				conns := make([]*rawConn, tc.conns)
				for i := range conns {
					c := dialRaw(b, br.Addr())
					for range tc.burst {
						c.write(b, protocol.GetRouteInfoByTopic, &protocol.GetRouteInfoRequestHeader{Topic: "mem"}, nil)
					}
					for range tc.burst {
						c.read(b)
					}
					conns[i] = c
				}
				// An idle connection keeps one read goroutine. Request goroutines kept for
				// the next request are let go once the connection has been idle for a sweep
				// of the server (FrameReadTimeout/8): wait for that, or measure what stays.
				deadline := time.Now().Add(2*remoting.DefaultFrameReadTimeout/8 + time.Second)
				for runtime.NumGoroutine() > goroutines+tc.conns && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				after := readMem()
				heap := float64(int64(after.heap-before.heap)) / float64(tc.conns)
				stack := float64(int64(after.stack-before.stack)) / float64(tc.conns)
				heapPerConn, stackPerConn, perConn = heap, stack, heap+stack
				for _, c := range conns {
					c.nc.Close()
				}
			}
			b.ReportMetric(perConn, "B/conn")
			b.ReportMetric(heapPerConn, "heap-B/conn")
			b.ReportMetric(stackPerConn, "stack-B/conn")
		})
	}
}

// BenchmarkParkedPullMemory parks pulls on empty queues (one per queue per connection, as a
// consumer does) and reports the memory each parked pull holds, apart from its connection
// and its queue: the pulls are counted against a baseline taken once the connections are open
// and every queue has been read once. B/parked-pull is heap plus goroutine stacks (a pull
// that held a goroutine while parked paid 4 KiB of stack or more on top of its heap);
// goroutines/parked-pull is the growth of the goroutine count over the pulls.
func BenchmarkParkedPullMemory(b *testing.B) {
	const (
		conns   = 10
		queues  = 1000
		pulls   = conns * queues
		suspend = 30 * time.Second
		window  = 128
	)
	br := startBroker(b, nil)
	require.NoError(b, br.CreateTopic(broker.TopicConfig{Name: "park", ReadQueueNums: queues, WriteQueueNums: queues, Perm: protocol.PermRead | protocol.PermWrite}))
	pull := func(c *rawConn, q int, suspend time.Duration) {
		h := pullHeader("park", 0, suspend, "*")
		h.QueueID = int32(q)
		h.ConsumerGroup = "park-group"
		c.write(b, protocol.PullMessage, h, nil)
	}
	var perPull, heapPerPull, stackPerPull, goroutinesPerPull float64
	for range b.N {
		cs := make([]*rawConn, conns)
		for i := range cs {
			cs[i] = dialRaw(b, br.Addr())
			// Every queue read once, without parking, in windows below the connection's
			// in-flight bound (256).
			for q0 := 0; q0 < queues; q0 += window {
				for q := q0; q < min(q0+window, queues); q++ {
					pull(cs[i], q, 0)
				}
				for q := q0; q < min(q0+window, queues); q++ {
					cs[i].read(b)
				}
			}
		}
		before := readMem()
		goroutines := runtime.NumGoroutine()
		parked := 0
		for _, c := range cs {
			for q0 := 0; q0 < queues; q0 += window {
				for q := q0; q < min(q0+window, queues); q++ {
					pull(c, q, suspend)
				}
				parked += min(window, queues-q0)
				waitParked(b, br, parked)
			}
		}
		after := readMem()
		goroutinesPerPull = float64(runtime.NumGoroutine()-goroutines) / pulls
		heap := float64(int64(after.heap-before.heap)) / pulls
		stack := float64(int64(after.stack-before.stack)) / pulls
		heapPerPull, stackPerPull, perPull = heap, stack, heap+stack
		for _, c := range cs {
			c.nc.Close()
		}
		waitParked(b, br, 0)
	}
	b.ReportMetric(perPull, "B/parked-pull")
	b.ReportMetric(heapPerPull, "heap-B/parked-pull")
	b.ReportMetric(stackPerPull, "stack-B/parked-pull")
	b.ReportMetric(goroutinesPerPull, "goroutines/parked-pull")
	b.ReportMetric(0, "ns/op")
}

// waitParked waits until exactly n pulls are parked on the broker.
func waitParked(tb testing.TB, br *testBroker, n int) {
	deadline := time.Now().Add(time.Minute)
	for br.WaitingPulls() != int64(n) {
		if time.Now().After(deadline) {
			tb.Fatalf("%d pulls parked after a minute, want %d", br.WaitingPulls(), n)
		}
		time.Sleep(time.Millisecond)
	}
}
