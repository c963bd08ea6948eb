package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/grpcserver"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// The gRPC scenarios measure the RocketMQ 5 endpoint through the generated client, as a 5.x
// client calls it: grpc-send-<size>, synchronous SendMessage calls of one message from
// --producers senders (a connection each), next to the same sends over remoting; and
// pop-<size>, one SimpleConsumer receiving batches of 32 and acknowledging each batch with
// one AckMessage, next to JetStream's pull consumer with explicit acks (Fetch(32), Ack
// each) on as many stored messages.
const (
	grpcPopBatch   = 32
	grpcSendSize   = 1024
	grpcRPCTimeout = 30 * time.Second
)

// grpcScenarios are the gRPC scenarios of a run, after the remoting ones.
func grpcScenarios() []benchScenario {
	return []benchScenario{
		{name: fmt.Sprintf("grpc-send-%d", grpcSendSize), kind: "grpc-send", size: grpcSendSize, mode: "sync"},
		{name: fmt.Sprintf("pop-%d", grpcSendSize), kind: "pop", size: grpcSendSize},
		{name: fmt.Sprintf("pop-floor-%d", grpcSendSize), kind: "pop-floor", size: grpcSendSize},
	}
}

// grpcResultNames are the results a gRPC scenario yields besides its own name's.
func grpcResultNames(sc benchScenario) []string {
	if sc.kind == "grpc-send" {
		return []string{sc.name + "-p50", sc.name + "-p99"}
	}
	return nil
}

// benchGRPCPort is a free loopback port for the `flowd serve` child's gRPC listener, named
// on its command line before it starts.
func benchGRPCPort() (string, error) {
	ports, err := benchPorts(1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), nil
}

// startBenchGRPC serves the RocketMQ 5 endpoint of an in-process broker on a free loopback
// port and returns its address and what stops it.
func startBenchGRPC(b *broker.Broker, log *slog.Logger) (string, func(), error) {
	srv, err := grpcserver.New(grpcserver.Config{Broker: b, Logger: log})
	if err != nil {
		return "", nil, fmt.Errorf("bench: gRPC endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench: gRPC listener: %w", err)
	}
	srv.Serve(ln)
	return ln.Addr().String(), func() { _ = srv.Shutdown(context.Background()) }, nil
}

// grpcClient is one 5.x client: its own connection and client id.
type grpcClient struct {
	conn *grpc.ClientConn
	api  pb.MessagingServiceClient
	id   string
}

func dialBenchGRPC(addr, id string) (*grpcClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("bench: gRPC client of %s: %w", addr, err)
	}
	return &grpcClient{conn: conn, api: pb.NewMessagingServiceClient(conn), id: id}, nil
}

// call is the context of one call, with the headers a 5.x client sends.
func (g *grpcClient) call(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, grpcRPCTimeout)
	return metadata.AppendToOutgoingContext(ctx, "x-mq-client-id", g.id, "x-mq-protocol", "v2"), cancel
}

// grpcSend sends c.messages bodies of size bytes over gRPC, one SendMessage of one message at
// a time from each of c.producers senders, to a topic a remoting send created, and returns
// messages per second and the calls' median and 99th-percentile latency.
func (r *benchRun) grpcSend(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	if c.grpcAddr == "" {
		return nil, errors.New("bench: the gRPC scenarios need the bench's own broker (no --namesrv)")
	}
	// The same synchronous sends over remoting are the baseline; the gRPC senders then send
	// to the topic they created.
	bw := newWindow(c.brokerPID)
	topic, base, err := flowdProduce(ctx, c, c.namesrv, "sync", sc.size, c.producers, r.log, bw)
	if err != nil {
		return nil, err
	}
	clients := make([]*grpcClient, 0, c.producers)
	defer func() {
		for _, g := range clients {
			g.conn.Close()
		}
	}()
	body := make([]byte, sc.size)
	var seq atomic.Int64
	send := func(ctx context.Context, g *grpcClient) error {
		cctx, cancel := g.call(ctx)
		defer cancel()
		id := fmt.Sprintf("01FLOWDBENCH%012d", seq.Add(1))
		resp, err := g.api.SendMessage(cctx, &pb.SendMessageRequest{Messages: []*pb.Message{{
			Topic: &pb.Resource{Name: topic}, Body: body,
			SystemProperties: &pb.SystemProperties{MessageId: id, MessageType: pb.MessageType_NORMAL, BodyEncoding: pb.Encoding_IDENTITY},
		}}})
		if err != nil {
			return fmt.Errorf("bench: gRPC send: %w", err)
		}
		if resp.GetStatus().GetCode() != pb.Code_OK {
			return fmt.Errorf("bench: gRPC send: %v %s", resp.GetStatus().GetCode(), resp.GetStatus().GetMessage())
		}
		return nil
	}
	for i := range c.producers {
		g, err := dialBenchGRPC(c.grpcAddr, fmt.Sprintf("flowd-bench-grpc-%d", i))
		if err != nil {
			return nil, err
		}
		clients = append(clients, g)
		if err := send(ctx, g); err != nil { // connects outside the clock, as the remoting producers' first send
			return nil, err
		}
	}
	lat := make([][]time.Duration, len(clients))
	errs := make([]error, len(clients))
	fw := newWindow(c.brokerPID)
	var wg sync.WaitGroup
	fw.begin()
	start := time.Now()
	for i, g := range clients {
		n := shareOf(c.messages, len(clients), i)
		lat[i] = make([]time.Duration, 0, n)
		wg.Go(func() {
			for range n {
				t0 := time.Now()
				if errs[i] = send(ctx, g); errs[i] != nil {
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	fw.end()
	if err := errors.Join(append(errs, windowErr(fw, bw))...); err != nil {
		return nil, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	res := newResult(sc.name, "msg/s", float64(c.messages)/elapsed.Seconds(), "remoting", base)
	res.Size, res.Producers, res.Durability, res.BaselineDurability = sc.size, c.producers, durAsync, durAsync
	res.addCosts(fw, bw, c.messages)
	p50 := newResult(sc.name+"-p50", "ns", float64(all[len(all)/2]), "", 0)
	p99 := newResult(sc.name+"-p99", "ns", float64(all[len(all)*99/100]), "", 0)
	return []benchResult{res, p50, p99}, nil
}
