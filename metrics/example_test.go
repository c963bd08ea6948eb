package metrics_test

import (
	"context"
	"log/slog"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/metrics"
)

// The daemon's wiring: the Metrics exists before the broker (its Observer goes into the
// broker's Config), and watches the broker once it runs.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	m := metrics.New(metrics.Options{})
	b, err := broker.New(broker.Config{Observer: m})
	if err != nil {
		return
	}
	if err := b.Start(); err != nil {
		return
	}
	stop := m.WatchBroker(b)
	defer stop()
	// With plugins and NATS: m.WatchPlugins(registry.Stats), m.WatchPublisher(publisher.Stats),
	// and metrics.NATSCheck(func() bool { return publisher.Stats().Connected }) among the checks.

	h := metrics.NewHandler(m.Registry(), slog.Default(), metrics.BrokerChecks(b)...)
	go func() { _ = metrics.Serve(ctx, "127.0.0.1:9108", h) }()
}
