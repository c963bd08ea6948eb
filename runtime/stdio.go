package runtime

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// guestLog logs guest output lines for all instances of a module version, at most lines per
// interval (a fixed window): a guest printing in a loop must not flood the daemon's log.
type guestLog struct {
	logger   *slog.Logger
	attrs    []slog.Attr
	lines    int
	interval time.Duration

	mu      sync.Mutex
	window  time.Time
	n       int
	pending uint64 // dropped in the current window, reported when the next opens
	dropped atomic.Uint64
}

func (g *guestLog) line(stream string, b []byte) {
	g.mu.Lock()
	now := time.Now()
	var report uint64
	if now.Sub(g.window) >= g.interval {
		report, g.pending = g.pending, 0
		g.window, g.n = now, 0
	}
	if g.n >= g.lines {
		g.pending++
		g.mu.Unlock()
		g.dropped.Add(1)
		return
	}
	g.n++
	g.mu.Unlock()
	ctx := context.Background()
	n := len(g.attrs)
	if report > 0 {
		g.logger.LogAttrs(ctx, slog.LevelWarn, "wasm guest output dropped",
			append(g.attrs[:n:n], slog.Uint64("lines", report))...)
	}
	g.logger.LogAttrs(ctx, slog.LevelInfo, "wasm guest output",
		append(g.attrs[:n:n], slog.String("stream", stream), slog.String("line", string(b)))...)
}

// lineWriter is one instance's stdout or stderr: it cuts output into lines (at most
// maxLogLine bytes each). An instance is used by one goroutine at a time, so the buffer
// needs no lock.
type lineWriter struct {
	log    *guestLog
	stream string
	buf    []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := maxLogLine - len(w.buf)
			if len(p) < room {
				w.buf = append(w.buf, p...)
				break
			}
			w.buf = append(w.buf, p[:room]...)
			p = p[room:]
			w.flush()
			continue
		}
		part := p[:i]
		p = p[i+1:]
		if len(w.buf)+len(part) > maxLogLine {
			part = part[:max(0, maxLogLine-len(w.buf))]
		}
		w.buf = append(w.buf, part...)
		w.log.line(w.stream, w.buf)
		w.buf = w.buf[:0]
	}
	return n, nil
}

// flush logs a partial line.
func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.log.line(w.stream, w.buf)
		w.buf = w.buf[:0]
	}
}
