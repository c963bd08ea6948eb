// Package grpcserver serves RocketMQ 5's gRPC messaging protocol (apache.rocketmq.v2's
// MessagingService) over a broker.Broker, in the daemon's process and over its store, so
// that the RocketMQ 5 clients reach flowd with no proxy between (docs/grpc.md). Consumers
// are pop-based: a receive hands out messages with an invisibility time and a receipt
// handle (broker.Broker.Pop), and the client acknowledges each one.
package grpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/flowd-io/flowd/broker"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// Config is what a Server is built from.
type Config struct {
	// Broker serves the messages. Required.
	Broker *broker.Broker
	// Advertise is the gRPC address ("host:port") that routes and assignments name: a client
	// sends everything to the endpoints of its routes. Default: the listener's address.
	Advertise string
	// Peers, when set, names the cluster's other brokers that host a topic, for routes and
	// assignments that list every node's queues (docs/grpc.md, "Clusters"). Default nil:
	// routes name this broker only.
	Peers Peers
	// ReplicaSet, when set, is this broker's replica set: on a replica, routes name the
	// master's gRPC endpoint for the set's queues. Default nil: no replica set.
	ReplicaSet ReplicaSet
	// TLS, when set, makes the endpoint speak TLS only.
	TLS *tls.Config
	// Logger; default slog.Default().
	Logger *slog.Logger
	// MaxReceiveWait caps the long polling of a receive (the client's long_polling_timeout).
	// Default 30 s.
	MaxReceiveWait time.Duration
	// MaxBatch caps the messages of one receive; a larger batch_size is served this many.
	// Default and most broker.PopMaxMessages.
	MaxBatch int
}

// Server is a gRPC endpoint of RocketMQ 5's messaging protocol. Create it with New, then
// Serve; Shutdown stops it.
type Server struct {
	pb.UnimplementedMessagingServiceServer

	cfg     Config
	b       *broker.Broker
	log     *slog.Logger
	grpc    *grpc.Server
	clients *clientTable
	stats   rpcStats

	mu        sync.Mutex
	ln        net.Listener
	advertise string
	served    chan struct{} // closed when Serve returns
	// stopping is closed by Shutdown: Telemetry sessions and long polls end at once
	// instead of holding the graceful stop up to their client's timeouts.
	stopping chan struct{}
	stopOnce sync.Once
	// stopCtx is canceled with stopping: a receive's long poll hangs off it (untilStop).
	stopCtx    context.Context
	stopCancel context.CancelFunc
}

// New builds a server over cfg.Broker and installs its transaction check-back path on it.
func New(cfg Config) (*Server, error) {
	if cfg.Broker == nil {
		return nil, errors.New("grpcserver: Config.Broker is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxReceiveWait <= 0 {
		cfg.MaxReceiveWait = 30 * time.Second
	}
	if cfg.MaxBatch <= 0 || cfg.MaxBatch > broker.PopMaxMessages {
		cfg.MaxBatch = broker.PopMaxMessages
	}
	s := &Server{cfg: cfg, b: cfg.Broker, log: cfg.Logger.With("component", "grpc"), clients: newClientTable(), served: make(chan struct{}), stopping: make(chan struct{})}
	s.stopCtx, s.stopCancel = context.WithCancel(context.Background())
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(64 << 20), grpc.UnaryInterceptor(s.countUnary), grpc.StreamInterceptor(s.countStream),
		// Deliveries written by hand go out as they are (wire.go).
		grpc.ForceServerCodecV2(newServerCodec()),
		// Calls run on a pool of goroutines, one per core, instead of a new goroutine (and
		// its stack growth) per call: a consumer makes two calls per batch. A call finding
		// them all busy (Telemetry streams, long polls) gets its own goroutine.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	pb.RegisterMessagingServiceServer(s.grpc, s)
	s.b.SetTransactionChecker(s.checkTransaction)
	return s, nil
}

// Serve serves on ln in the background until Shutdown.
func (s *Server) Serve(ln net.Listener) {
	s.mu.Lock()
	s.ln = ln
	s.advertise = s.cfg.Advertise
	if s.advertise == "" {
		s.advertise = ln.Addr().String()
	}
	s.mu.Unlock()
	go func() {
		defer close(s.served)
		if err := s.grpc.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("gRPC endpoint stopped", "err", err)
		}
	}()
}

// Addr is the bound address, empty before Serve.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Advertise is the address routes name for this broker (Config.Advertise or the bound
// one), empty before Serve.
func (s *Server) Advertise() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.advertise
}

// Clients is how many gRPC clients hold a Telemetry session or sent a heartbeat recently.
func (s *Server) Clients() int { return s.clients.len() }

// Shutdown stops accepting, ends the open streams (a receive's long poll ends at once) and
// waits for the running calls until ctx ends, then closes what is left.
func (s *Server) Shutdown(ctx context.Context) error {
	s.b.SetTransactionChecker(nil)
	s.stopOnce.Do(func() {
		close(s.stopping)
		s.stopCancel()
	})
	s.clients.closeAll()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		return fmt.Errorf("grpc shutdown: %w", ctx.Err())
	}
}

// advertised is the endpoint routes name.
func (s *Server) advertised() *pb.Endpoints {
	s.mu.Lock()
	addr := s.advertise
	s.mu.Unlock()
	return endpointsOf(addr)
}

// clientID is the x-mq-client-id header every RocketMQ 5 client sends.
func clientID(ctx context.Context) string {
	// ValueFromIncomingContext reads the header without copying the call's metadata.
	if v := metadata.ValueFromIncomingContext(ctx, "x-mq-client-id"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// peerAddr is the remote address of the call.
func peerAddr(ctx context.Context) net.Addr {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr
	}
	return nil
}

// untilStop is ctx, canceled also when Shutdown begins: a callback on the server's stop, not
// a goroutine per receive waiting for it.
func (s *Server) untilStop(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.stopCtx, cancel)
	return ctx, func() {
		unhook()
		cancel()
	}
}
