package remoting_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
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

// BenchmarkFileRegions measures responses whose bodies are regions of a file (in the page
// cache), sent with sendfile (threshold 1) or copied into the write buffer (threshold -1),
// in the same run: 32 regions of 1 KiB (a pull of small messages of interleaved queues), 4 of
// 8 KiB, one
// of 32 KiB (a pull of adjacent ones) and one of 256 KiB.
func BenchmarkFileRegions(b *testing.B) {
	path := filepath.Join(b.TempDir(), "regions")
	content := make([]byte, 4<<20)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	shapes := []struct {
		name    string
		n, size int
	}{{"32x1KiB", 32, 1 << 10}, {"4x8KiB", 4, 8 << 10}, {"1x32KiB", 1, 32 << 10}, {"1x256KiB", 1, 256 << 10}}
	for _, sh := range shapes {
		for _, mode := range []struct {
			name      string
			threshold int64
		}{{"sendfile", 1}, {"copy", -1}} {
			b.Run(sh.name+"/"+mode.name, func(b *testing.B) {
				h := HandlerFuncRegions(f, sh.n, sh.size)
				ln, err := netListen()
				if err != nil {
					b.Fatal(err)
				}
				srv := remoting.NewServer(h, remoting.ServerOptions{Logger: quietLogger(), SendfileThreshold: mode.threshold})
				go func() { _ = srv.Serve(ln) }()
				defer srv.Close()
				c, err := remoting.Dial(context.Background(), ln.Addr().String(), remoting.ClientOptions{Logger: quietLogger()})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				b.SetBytes(int64(sh.n * sh.size))
				b.SetParallelism(4)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						resp, err := c.Invoke(context.Background(), protocol.NewRequest(codeEcho, nil, nil))
						if err != nil || len(resp.Body) != sh.n*sh.size {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// HandlerFuncRegions answers every request with n regions of size bytes of f, spaced apart
// so that none are adjacent.
func HandlerFuncRegions(f *os.File, n, size int) remoting.Handler {
	return remoting.HandlerFunc(func(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
		regions := make([]remoting.FileRegion, n)
		for i := range regions {
			regions[i] = remoting.FileRegion{File: f, Offset: int64(i * 2 * size), Length: int64(size)}
		}
		resp := protocol.NewResponse(req, protocol.Success, "")
		remoting.RespondWithFiles(ctx, resp, regions, nil)
		return resp
	})
}
