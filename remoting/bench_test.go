package remoting_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/remoting"
)

// benchRequest is a small request shaped like a consumer-offset update.
func benchRequest() *protocol.Command {
	return protocol.NewRequest(codeEcho, map[string]string{
		"consumerGroup": "group-a", "topic": "orders", "queueId": "3", "commitOffset": "123456",
	}, []byte("0123456789abcdef0123456789abcdef"))
}

func benchConn(b *testing.B, st protocol.SerializeType) *remoting.Conn {
	h := remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
		resp := protocol.NewResponse(req, protocol.Success, "")
		resp.Body = req.Body
		return resp
	})
	ln, err := netListen()
	if err != nil {
		b.Fatal(err)
	}
	srv := remoting.NewServer(h, remoting.ServerOptions{Logger: quietLogger()})
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	c, err := remoting.Dial(context.Background(), ln.Addr().String(), remoting.ClientOptions{Serialize: st, Logger: quietLogger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		b.Run(st.String(), func(b *testing.B) {
			c := benchConn(b, st)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Invoke(ctx, benchRequest()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkRoundTripParallel pipelines requests from GOMAXPROCS goroutines over one
// connection, as a client process does.
func BenchmarkRoundTripParallel(b *testing.B) {
	for _, st := range []protocol.SerializeType{protocol.JSON, protocol.RocketMQ} {
		b.Run(st.String(), func(b *testing.B) {
			c := benchConn(b, st)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Invoke(ctx, benchRequest()); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
