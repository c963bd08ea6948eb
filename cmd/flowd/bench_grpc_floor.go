package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// The gRPC floor is a stand-in for a RocketMQ 5 endpoint that does no work of its own: each
// ReceiveMessage answers the batch size asked for with copies of one delivery encoded once
// (no store, no pop state, no digest), each AckMessage answers OK for every entry. The same
// client as pop-1024's receives and acknowledges from it, so pop-floor-1024 is what the
// protocol costs over grpc-go before a broker does anything: the most any endpoint of the
// protocol can reach on the machine, with one streamed response a message as the protocol
// has it. Set next to pop-1024, it tells how far flowd's own work is from that.

// floorServing is the line the floor child prints once it serves.
var floorServing = regexp.MustCompile(`grpc floor serving addr=(\S+)`)

// floorDelivery is a ReceiveMessageResponse already in wire format; floorCodec sends it as
// it is.
type floorDelivery []byte

// floorCodec is grpc's proto codec, except that a *floorDelivery goes out untouched.
type floorCodec struct{ proto encoding.CodecV2 }

func (c floorCodec) Marshal(v any) (mem.BufferSlice, error) {
	if d, ok := v.(*floorDelivery); ok {
		return mem.BufferSlice{mem.SliceBuffer(*d)}, nil
	}
	return c.proto.Marshal(v)
}

func (c floorCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

func (c floorCodec) Name() string { return grpcproto.Name }

// floorService is the stand-in's MessagingService.
type floorService struct {
	pb.UnimplementedMessagingServiceServer
	delivery floorDelivery
}

// newFloorService encodes the one delivery, of a size-byte body with the system properties a
// flowd delivery carries (a receipt handle of a flowd handle's length included).
func newFloorService(size int) (*floorService, error) {
	tag, now := "bench", timestamppb.Now()
	enc, err := proto.Marshal(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Message{Message: &pb.Message{
		Topic: &pb.Resource{Name: "flowd-bench-floor"}, Body: make([]byte, size),
		SystemProperties: &pb.SystemProperties{
			Tag: &tag, MessageId: "7F00000100002A9F0000000000000000", MessageType: pb.MessageType_NORMAL,
			BodyDigest:    &pb.Digest{Type: pb.DigestType_MD5, Checksum: strings.Repeat("0", 32)},
			BornTimestamp: now, BornHost: "127.0.0.1", StoreTimestamp: now, StoreHost: "127.0.0.1:10911",
			ReceiptHandle: proto.String(strings.Repeat("h", 96)), QueueId: 1, QueueOffset: proto.Int64(1 << 20),
			InvisibleDuration: durationpb.New(time.Minute), DeliveryAttempt: proto.Int32(1),
		},
	}}})
	if err != nil {
		return nil, fmt.Errorf("bench: encode the floor's delivery: %w", err)
	}
	return &floorService{delivery: enc}, nil
}

func (f *floorService) ReceiveMessage(req *pb.ReceiveMessageRequest, stream pb.MessagingService_ReceiveMessageServer) error {
	if err := stream.Send(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_DeliveryTimestamp{DeliveryTimestamp: timestamppb.Now()}}); err != nil {
		return err
	}
	for range req.GetBatchSize() {
		if err := stream.SendMsg(&f.delivery); err != nil {
			return err
		}
	}
	return stream.Send(&pb.ReceiveMessageResponse{Content: &pb.ReceiveMessageResponse_Status{Status: &pb.Status{Code: pb.Code_OK}}})
}

func (f *floorService) AckMessage(_ context.Context, req *pb.AckMessageRequest) (*pb.AckMessageResponse, error) {
	resp := &pb.AckMessageResponse{Status: &pb.Status{Code: pb.Code_OK}, Entries: make([]*pb.AckMessageResultEntry, 0, len(req.GetEntries()))}
	for _, e := range req.GetEntries() {
		resp.Entries = append(resp.Entries, &pb.AckMessageResultEntry{MessageId: e.GetMessageId(), ReceiptHandle: e.GetReceiptHandle(), Status: &pb.Status{Code: pb.Code_OK}})
	}
	return resp, nil
}

// serveFloor serves the stand-in on a free loopback port until the returned stop.
func serveFloor(size int) (addr string, stop func(), err error) {
	svc, err := newFloorService(size)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("bench: listen for the gRPC floor: %w", err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodecV2(floorCodec{proto: encoding.GetCodecV2(grpcproto.Name)}))
	pb.RegisterMessagingServiceServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), srv.Stop, nil
}

// benchGRPCFloorCommand is the hidden "flowd bench-grpc-floor": the floor in a process of
// its own, for a --deploy separate run. It serves until interrupted or killed.
func benchGRPCFloorCommand() *cobra.Command {
	var size int
	cmd := &cobra.Command{
		Use:    "bench-grpc-floor --size N",
		Short:  "Serve the gRPC floor of flowd bench (started by flowd bench --deploy separate)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			addr, stop, err := serveFloor(size)
			if err != nil {
				return err
			}
			defer stop()
			fmt.Fprintf(cmd.OutOrStdout(), "grpc floor serving addr=%s\n", addr)
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().IntVar(&size, "size", grpcSendSize, "body size of the delivery, in bytes")
	return cmd
}

// grpcFloor receives c.messages messages from the floor with pop-1024's client, next to the
// same JetStream baseline, and returns the receive + ack rate; the window measures the
// floor's process as a broker's.
func (r *benchRun) grpcFloor(ctx context.Context, sc benchScenario) ([]benchResult, error) {
	c := r.c
	jsRate, jw, err := r.jsFetchAck(ctx, sc)
	if err != nil {
		return nil, err
	}
	addr, pid, stop, err := startFloor(ctx, c, sc.size)
	if err != nil {
		return nil, err
	}
	defer stop()
	g, err := dialBenchGRPC(addr, fmt.Sprintf("flowd-bench-floor-%d", time.Now().UnixNano()))
	if err != nil {
		return nil, err
	}
	defer g.conn.Close()
	fw := newWindow(pid)
	rate, err := g.popAll(ctx, "flowd-bench-floor", "flowd-bench-floor", c.messages, fw)
	if err != nil {
		return nil, fmt.Errorf("bench: gRPC floor: %w", err)
	}
	return consumeResult(sc, rate, jsRate, fw, jw, c.messages)
}

// startFloor starts the floor: a child process with --deploy separate, else in this one
// (pid 0).
func startFloor(ctx context.Context, c benchConfig, size int) (addr string, pid int, stop func(), err error) {
	if c.deploy != deploySeparate {
		addr, stop, err = serveFloor(size)
		return addr, 0, stop, err
	}
	nd := &benchNode{name: "grpc-floor", bin: c.flowdBin, args: []string{"bench-grpc-floor", "--size", fmt.Sprint(size)}}
	if err := nd.start(); err != nil {
		return "", 0, nil, err
	}
	m, err := nd.awaitLine(ctx, floorServing)
	if err != nil {
		nd.kill()
		return "", 0, nil, fmt.Errorf("bench: start the gRPC floor: %w", err)
	}
	return m[1], nd.cmd.Process.Pid, nd.kill, nil
}
