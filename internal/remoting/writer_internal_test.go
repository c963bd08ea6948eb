package remoting

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// gatedConn is a net.Conn whose first Write blocks until the gate opens, and which counts
// Writes, that is, system calls on a real socket.
type gatedConn struct {
	gate    chan struct{}
	writes  atomic.Int32
	bytes   atomic.Int64
	closed  chan struct{}
	closeMu sync.Once
}

func (g *gatedConn) Write(p []byte) (int, error) {
	if g.writes.Add(1) == 1 {
		<-g.gate
	}
	g.bytes.Add(int64(len(p)))
	return len(p), nil
}

func (g *gatedConn) Read([]byte) (int, error) { <-g.closed; return 0, net.ErrClosed }
func (g *gatedConn) Close() error {
	g.closeMu.Do(func() { close(g.closed) })
	return nil
}
func (g *gatedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (g *gatedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (g *gatedConn) SetDeadline(time.Time) error      { return nil }
func (g *gatedConn) SetReadDeadline(time.Time) error  { return nil }
func (g *gatedConn) SetWriteDeadline(time.Time) error { return nil }

// Frames written while another write is under way leave together: one system call for the
// first, one for all that queued behind it.
func TestWriterBatchesQueuedFrames(t *testing.T) {
	g := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1, writeTimeout: time.Second}
	c := newConn(g, cfg)
	defer c.Close()

	frame := func(i int) *protocol.Command {
		return protocol.NewResponse(&protocol.Command{Opaque: int32(i)}, protocol.Success, "")
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := c.writeCommand(frame(0))
		assert.NoError(t, err)
	})
	require.Eventually(t, func() bool { return g.writes.Load() == 1 }, 3*time.Second, time.Millisecond, "first flush blocked")

	const queued = 50
	var want int64
	for i := 1; i <= queued; i++ {
		b, err := frame(i).AppendFrame(nil)
		require.NoError(t, err)
		want += int64(len(b))
		wg.Go(func() {
			_, err := c.writeCommand(frame(i))
			assert.NoError(t, err)
		})
	}
	require.Eventually(t, func() bool { return c.queuedFrames() == queued }, 3*time.Second, time.Millisecond)
	close(g.gate)
	wg.Wait()

	b0, _ := frame(0).AppendFrame(nil)
	assert.Equal(t, int32(2), g.writes.Load(), "the %d queued frames left in one write", queued)
	assert.Equal(t, want+int64(len(b0)), g.bytes.Load())
}

// failingConn is a net.Conn whose first Write blocks until the gate opens and then fails, as
// a socket whose peer went away does.
type failingConn struct {
	gatedConn
}

func (f *failingConn) Write(p []byte) (int, error) {
	if f.writes.Add(1) == 1 {
		<-f.gate
	}
	return 0, net.ErrClosed
}

// A frame on an idle connection is written by its own caller before writeCommand returns:
// the writer never waits for company.
func TestWriterWritesLoneFrameAtOnce(t *testing.T) {
	g := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	close(g.gate)
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1}
	c := newConn(g, cfg)
	defer c.Close()

	for i := 1; i <= 3; i++ {
		written, err := c.writeCommand(protocol.NewResponse(&protocol.Command{Opaque: int32(i)}, protocol.Success, ""))
		require.NoError(t, err)
		require.True(t, written)
		require.Equal(t, int32(i), g.writes.Load(), "frame %d written before writeCommand returned", i)
		require.Zero(t, c.queuedFrames())
	}
}

// A write that fails fails every frame that was to leave with it, and those queued after it,
// each caller getting the connection's error.
func TestWriterErrorFailsWholeBatch(t *testing.T) {
	f := &failingConn{gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}}
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1}
	c := newConn(f, cfg)
	defer c.Close()

	frame := func(i int) *protocol.Command {
		return protocol.NewResponse(&protocol.Command{Opaque: int32(i)}, protocol.Success, "")
	}
	const queued = 20
	errs := make(chan error, queued+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		_, err := c.writeCommand(frame(0))
		errs <- err
	})
	require.Eventually(t, func() bool { return f.writes.Load() == 1 }, 3*time.Second, time.Millisecond, "first write blocked")
	for i := 1; i <= queued; i++ {
		wg.Go(func() {
			_, err := c.writeCommand(frame(i))
			errs <- err
		})
	}
	require.Eventually(t, func() bool { return c.queuedFrames() == queued }, 3*time.Second, time.Millisecond)
	close(f.gate)
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		n++
		require.ErrorIs(t, err, ErrConnClosed)
		require.ErrorIs(t, err, net.ErrClosed)
	}
	require.Equal(t, queued+1, n)
	require.Equal(t, int32(1), f.writes.Load(), "nothing written after the connection failed")
}

// Frames queued without waiting (InvokeAsync's) by one goroutine while a write is under way
// leave together: the caller only queues them, and the flusher writes what gathered.
func TestFlusherGathersQueuedFrames(t *testing.T) {
	g := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1, writeTimeout: time.Second}
	c := newConn(g, cfg)
	defer c.Close()

	frame := func(i int) *protocol.Command {
		return protocol.NewResponse(&protocol.Command{Opaque: int32(i)}, protocol.Success, "")
	}
	var want int64
	for i := 0; i <= 50; i++ {
		b, err := frame(i).AppendFrame(nil)
		require.NoError(t, err)
		want += int64(len(b))
		require.NoError(t, c.queueCommand(frame(i))) // returns at once, even while the write blocks
		if i == 0 {
			require.Eventually(t, func() bool { return g.writes.Load() == 1 }, 3*time.Second, time.Millisecond, "first write blocked")
		}
	}
	require.Equal(t, 50, c.queuedFrames())
	close(g.gate)
	require.Eventually(t, func() bool { return g.bytes.Load() == want }, 3*time.Second, time.Millisecond)
	assert.Equal(t, int32(2), g.writes.Load(), "the 50 queued frames left in one write")
	assert.Zero(t, c.queuedFrames())
}

// A caller that writes its own frame and finds only queued frames without a waiting caller
// behind it hands them to the flusher; a caller queued behind the flusher's write has its
// frame written by the flusher.
func TestWriterAndFlusherHandOver(t *testing.T) {
	g := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1, writeTimeout: time.Second}
	c := newConn(g, cfg)
	defer c.Close()
	frame := func(i int) *protocol.Command {
		return protocol.NewResponse(&protocol.Command{Opaque: int32(i)}, protocol.Success, "")
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		written, err := c.writeCommand(frame(0)) // the caller is the writer, held at the gate
		assert.NoError(t, err)
		assert.True(t, written)
	})
	require.Eventually(t, func() bool { return g.writes.Load() == 1 }, 3*time.Second, time.Millisecond)
	for i := 1; i <= 10; i++ {
		require.NoError(t, c.queueCommand(frame(i)))
	}
	close(g.gate)
	wg.Wait()
	require.Eventually(t, func() bool { return c.queuedFrames() == 0 && g.writes.Load() == 2 }, 3*time.Second, time.Millisecond,
		"the flusher wrote the 10 queued frames in one write")

	// Now the flusher writes, held by a second gate; a caller queued behind it is written by it.
	g2 := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	c2 := newConn(g2, cfg)
	defer c2.Close()
	require.NoError(t, c2.queueCommand(frame(0)))
	require.Eventually(t, func() bool { return g2.writes.Load() == 1 }, 3*time.Second, time.Millisecond)
	done := make(chan error, 1)
	go func() {
		_, err := c2.writeCommand(frame(1))
		done <- err
	}()
	require.Eventually(t, func() bool { return c2.queuedFrames() == 1 }, 3*time.Second, time.Millisecond)
	close(g2.gate)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("a caller queued behind the flusher was never written")
	}
	assert.Equal(t, int32(2), g2.writes.Load())
}

// A batch of queued frames as large as a producer's 256 sends of 1 KiB in flight (over
// 256 KiB) keeps its buffer for the next batch: dropping it made every such batch grow a
// new one by doubling, copying the frames again at each step (a tenth of a producer's CPU).
func TestQueuedBatchBufferKeptAtInFlightSize(t *testing.T) {
	g := &gatedConn{gate: make(chan struct{}), closed: make(chan struct{})}
	cfg := &connConfig{logger: slog.New(slog.DiscardHandler), maxFrame: protocol.MaxFrameSize, maxInFlight: 1, writeTimeout: time.Second}
	c := newConn(g, cfg)
	defer c.Close()

	body := make([]byte, 1200)
	var want int64
	for i := 0; i <= 256; i++ {
		cmd := &protocol.Command{Code: int32(protocol.SendMessageV2), Opaque: int32(i), Body: body}
		b, err := cmd.AppendFrame(nil)
		require.NoError(t, err)
		want += int64(len(b))
		require.NoError(t, c.queueCommand(cmd))
		if i == 0 {
			require.Eventually(t, func() bool { return g.writes.Load() == 1 }, 3*time.Second, time.Millisecond, "first write blocked")
		}
	}
	close(g.gate)
	require.Eventually(t, func() bool { return g.bytes.Load() == want }, 3*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		c.qmu.Lock()
		defer c.qmu.Unlock()
		return !c.writing
	}, 3*time.Second, time.Millisecond)
	c.qmu.Lock()
	kept := max(cap(c.qbuf), cap(c.qspare))
	c.qmu.Unlock()
	assert.GreaterOrEqual(t, kept, 256*len(body), "the batch's buffer is kept for the next")
}
