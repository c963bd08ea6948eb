package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/flowd-io/flowd/broker"
)

// Check is one readiness condition: Fn returns nil when it holds, else why not. Fn must
// honour ctx (the probe's request context, bounded by CheckTimeout).
type Check struct {
	Name string
	Fn   func(ctx context.Context) error
}

// CheckTimeout bounds each readiness check, so that a hung dependency makes /readyz answer
// not-ready instead of hanging the probe.
const CheckTimeout = 2 * time.Second

// ErrNotReady is wrapped by the errors of the checks below when the condition does not hold.
var ErrNotReady = errors.New("not ready")

// NewHandler returns the HTTP handler of the metrics endpoint:
//
//   - /metrics: the registry g in Prometheus' exposition format (Metrics.Registry);
//   - /healthz: 200 "ok" while the process serves HTTP at all (liveness);
//   - /readyz: 200 "ok" when every check passes, else 503 with one line per failing check
//     (readiness: broker serving, store writable, NATS connected when configured).
//
// logger receives scrape errors; nil discards them.
func NewHandler(g prometheus.Gatherer, logger *slog.Logger, checks ...Check) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(logger.Handler(), slog.LevelError),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		var failed []string
		for _, c := range checks {
			ctx, cancel := context.WithTimeout(r.Context(), CheckTimeout)
			err := c.Fn(ctx)
			cancel()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", c.Name, err))
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if len(failed) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, strings.Join(failed, "\n"))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// BrokerChecks returns the readiness checks of a broker: "broker" (its listener accepts a
// connection) and "store" (the store accepts writes).
func BrokerChecks(b *broker.Broker) []Check {
	return []Check{
		{Name: "broker", Fn: func(ctx context.Context) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", b.Addr())
			if err != nil {
				return fmt.Errorf("dial broker %s: %w: %w", b.Addr(), ErrNotReady, err)
			}
			return c.Close()
		}},
		{Name: "store", Fn: func(context.Context) error {
			if err := b.StoreStats().WriteFailure; err != nil {
				return fmt.Errorf("store refuses writes: %w: %w", ErrNotReady, err)
			}
			return nil
		}},
	}
}

// NATSCheck returns the readiness check "nats": connected reports whether the NATS
// connection is up (for instance func() bool { return nc.IsConnected() }, or a Publisher's
// Stats().Connected). Add it only when NATS is configured.
func NATSCheck(connected func() bool) Check {
	return Check{Name: "nats", Fn: func(context.Context) error {
		if !connected() {
			return fmt.Errorf("nats disconnected: %w", ErrNotReady)
		}
		return nil
	}}
}

// Serve serves h on addr until ctx ends, then shuts the server down gracefully: it stops
// accepting, lets requests in flight finish for up to 5 s, and returns nil. It returns an
// error when addr cannot be listened on or the server fails.
func Serve(ctx context.Context, addr string, h http.Handler) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen %s: %w", addr, err)
	}
	return ServeListener(ctx, ln, h)
}

// ServeListener is Serve on a listener the caller opened (to learn the bound address of
// port 0, or to fail before anything else starts when the address is taken).
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics: serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("metrics: shutdown %s: %w", ln.Addr(), err)
	}
	<-errc // http.ErrServerClosed
	return nil
}
