// Command flowd runs the flowd daemon: a RocketMQ-compatible broker with its built-in name
// service.
//
// Usage:
//
//	flowd [serve] [flags]   run the broker (the default)
//	flowd bench [flags]     measure throughput and delivery delay
//	flowd version           print the version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/flowd-io/flowd/broker"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "flowd:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	if len(args) > 0 && args[0] != "" && args[0][0] != '-' {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stderr)
	case "bench":
		return bench(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "flowd", version)
		return nil
	case "help":
		usage(stdout)
		return nil
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", cmd)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `flowd — a programmable message stream daemon that speaks RocketMQ's protocol.

Usage:
  flowd [serve] [flags]   run the broker and its name service (the default)
  flowd bench [flags]     measure produce, consume and delivery delay against a broker
  flowd version           print the version
  flowd help              show this help

Run "flowd serve -h" for the serve flags.
`)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg broker.Config
	fs.StringVar(&cfg.DataDir, "data-dir", "./flowd-data", "directory for the commit log, consume queues and broker state")
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:10911", "broker address")
	fs.StringVar(&cfg.NamesrvListen, "namesrv-listen", "127.0.0.1:9876", `name service address ("off" to disable)`)
	fs.StringVar(&cfg.Cluster, "cluster", "local", "cluster name announced in routes")
	fs.StringVar(&cfg.BrokerName, "broker-name", "broker-a", "broker name announced in routes")
	fs.StringVar(&cfg.AdvertisedAddr, "advertise", "", "address put into routes (default: the listen address)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("serve: --log-level %q: %w", *logLevel, err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	b, err := broker.New(cfg)
	if err != nil {
		return err
	}
	if err := b.Start(); err != nil {
		return errors.Join(err, b.Shutdown(context.Background()))
	}
	log.Info("flowd serving", "version", version, "broker", b.Addr(), "namesrv", b.NamesrvAddr(), "data", cfg.DataDir)
	<-ctx.Done()
	log.Info("flowd stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.Shutdown(sctx)
}
