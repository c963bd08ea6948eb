package grpcserver

import (
	"context"
	"path"
	"sort"
	"sync"

	"google.golang.org/grpc"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// RPCCount is how many calls of one RPC ended with one status code.
type RPCCount struct {
	RPC   string // "SendMessage", "ReceiveMessage", …
	Code  string // the protocol's status code ("OK", "TOPIC_NOT_FOUND", …); "STREAM" for Telemetry, "TRANSPORT_ERROR" for a call without an answer
	Calls uint64
}

// rpcStats counts calls by RPC and status code; its lock is a leaf.
type rpcStats struct {
	mu     sync.Mutex
	counts map[[2]string]uint64
}

func (r *rpcStats) add(rpc, code string) {
	r.mu.Lock()
	if r.counts == nil {
		r.counts = map[[2]string]uint64{}
	}
	r.counts[[2]string{rpc, code}]++
	r.mu.Unlock()
}

// RPCCounts returns the calls served so far by RPC and status code, sorted.
func (s *Server) RPCCounts() []RPCCount {
	s.stats.mu.Lock()
	out := make([]RPCCount, 0, len(s.stats.counts))
	for k, n := range s.stats.counts {
		out = append(out, RPCCount{RPC: k[0], Code: k[1], Calls: n})
	}
	s.stats.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].RPC != out[j].RPC {
			return out[i].RPC < out[j].RPC
		}
		return out[i].Code < out[j].Code
	})
	return out
}

// statused is every response of the protocol's unary RPCs.
type statused interface{ GetStatus() *pb.Status }

// countUnary counts a unary call by the status code its response carries: the protocol
// answers a refusal in the response, not as a gRPC error.
func (s *Server) countUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	code := "TRANSPORT_ERROR"
	if r, ok := resp.(statused); ok && err == nil {
		code = r.GetStatus().GetCode().String()
	}
	s.stats.add(path.Base(info.FullMethod), code)
	return resp, err
}

// countingStream remembers the last status a server stream sent.
type countingStream struct {
	grpc.ServerStream
	code string
}

func (c *countingStream) SendMsg(m any) error {
	if r, ok := m.(*pb.ReceiveMessageResponse); ok {
		if st := r.GetStatus(); st != nil {
			c.code = st.GetCode().String()
		}
	}
	return c.ServerStream.SendMsg(m)
}

func (s *Server) countStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	cs := &countingStream{ServerStream: ss, code: "TRANSPORT_ERROR"}
	if info.IsClientStream {
		cs.code = "STREAM"
	}
	err := handler(srv, cs)
	s.stats.add(path.Base(info.FullMethod), cs.code)
	return err
}
