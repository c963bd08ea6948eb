package remoting_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

const codeFile protocol.RequestCode = 1010 // answers with regions of the test file

// fileServer answers codeFile requests with regions of a file (ext fields "regions":
// "off:len,off:len,...") and echoes everything else, so that file-region frames and plain
// frames share the connection.
type fileServer struct {
	file     io.ReaderAt
	content  []byte
	released atomic.Int64
	served   atomic.Int64
	// other makes the Handler return a different response after RespondWithFiles.
	other bool
}

func (s *fileServer) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	if req.RequestCode() != codeFile {
		return echo(req)
	}
	regions, err := parseRegions(req.ExtFields["regions"])
	if err != nil {
		return protocol.NewResponse(req, protocol.InvalidParameter, err.Error())
	}
	for i := range regions {
		regions[i].File = s.file
	}
	resp := protocol.NewResponse(req, protocol.Success, "file")
	resp.ExtFields["k"] = req.ExtFields["k"]
	s.served.Add(1)
	if !remoting.RespondWithFiles(ctx, resp, regions, func() { s.released.Add(1) }) {
		return protocol.NewResponse(req, protocol.SystemError, "RespondWithFiles refused")
	}
	if s.other {
		return protocol.NewResponse(req, protocol.SystemError, "changed my mind")
	}
	return resp
}

func parseRegions(s string) ([]remoting.FileRegion, error) {
	var out []remoting.FileRegion
	for _, part := range bytes.Split([]byte(s), []byte(",")) {
		if len(part) == 0 {
			continue
		}
		var off, n int64
		if _, err := fmt.Sscanf(string(part), "%d:%d", &off, &n); err != nil {
			return nil, err
		}
		out = append(out, remoting.FileRegion{Offset: off, Length: n})
	}
	return out, nil
}

func startFileServer(t *testing.T, fs *fileServer, opts remoting.ServerOptions) *remoting.Conn {
	t.Helper()
	opts.Logger = quietLogger()
	srv := remoting.NewServer(fs, opts)
	ln, err := netListen()
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	c, err := remoting.Dial(context.Background(), ln.Addr().String(), remoting.ClientOptions{Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testFile writes n random bytes to a file and returns it open, with its content.
func testFile(t *testing.T, n int) (*os.File, []byte) {
	t.Helper()
	content := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range content {
		content[i] = byte(r.IntN(256))
	}
	path := filepath.Join(t.TempDir(), "regions")
	require.NoError(t, os.WriteFile(path, content, 0o644))
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f, content
}

// TestRespondWithFiles pipelines file-region responses (small regions copied, large ones
// sent with sendfile, depending on the threshold) with plain responses on one connection:
// every body must be exactly its regions' bytes in order, frames must not mix, and every
// release must run once.
func TestRespondWithFiles(t *testing.T) {
	f, content := testFile(t, 1<<20)
	cases := []struct {
		name      string
		file      io.ReaderAt
		threshold int64
	}{
		{"default threshold", f, 0},
		{"sendfile everything", f, 1},
		{"copy everything", f, -1},
		{"no descriptor", bytes.NewReader(content), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := &fileServer{file: tc.file, content: content}
			c := startFileServer(t, fs, remoting.ServerOptions{SendfileThreshold: tc.threshold})
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 7))
					for i := range 40 {
						if i%3 == 0 {
							body := fmt.Sprintf("plain-%d-%d", g, i)
							resp, err := c.Invoke(context.Background(), echoRequest(body))
							if assert.NoError(t, err) {
								assert.Equal(t, body, string(resp.Body))
							}
							continue
						}
						var spec []byte
						var want []byte
						for range 1 + r.IntN(5) {
							n := 1 + r.IntN(4<<10)
							if r.IntN(3) == 0 {
								n = 16<<10 + r.IntN(300<<10) // above the default threshold and the write buffer
							}
							off := r.IntN(len(content) - n)
							spec = fmt.Appendf(spec, "%d:%d,", off, n)
							want = append(want, content[off:off+n]...)
						}
						key := strconv.Itoa(g*1000 + i)
						resp, err := c.Invoke(context.Background(), protocol.NewRequest(codeFile, map[string]string{"regions": string(spec), "k": key}, nil))
						if !assert.NoError(t, err) {
							return
						}
						assert.Equal(t, protocol.Success, resp.ResponseCode(), resp.Remark)
						assert.Equal(t, key, resp.ExtFields["k"])
						assert.True(t, bytes.Equal(want, resp.Body), "regions %s", spec)
					}
				})
			}
			wg.Wait()
			require.Eventually(t, func() bool { return fs.released.Load() == fs.served.Load() }, 5*time.Second, time.Millisecond)
			assert.Positive(t, fs.served.Load())
		})
	}
}

// TestRespondWithFilesReleasedWhenNotSent: a Handler that registers regions and then returns
// another response gets them released, and the other response goes out.
func TestRespondWithFilesReleasedWhenNotSent(t *testing.T) {
	f, content := testFile(t, 4096)
	fs := &fileServer{file: f, content: content, other: true}
	c := startFileServer(t, fs, remoting.ServerOptions{})
	resp, err := c.Invoke(context.Background(), protocol.NewRequest(codeFile, map[string]string{"regions": "0:100"}, nil))
	require.NoError(t, err)
	assert.Equal(t, protocol.SystemError, resp.ResponseCode())
	assert.Empty(t, resp.Body)
	require.Eventually(t, func() bool { return fs.released.Load() == 1 }, 5*time.Second, time.Millisecond)
}

// TestRespondWithFilesShortFile: a region past the end of its file cannot be completed once
// its header is out, so the connection closes (the caller sees its call fail, not a
// truncated or shifted body), and the regions are released.
func TestRespondWithFilesShortFile(t *testing.T) {
	f, content := testFile(t, 64<<10)
	for _, threshold := range []int64{1, -1} {
		t.Run(fmt.Sprint("threshold ", threshold), func(t *testing.T) {
			fs := &fileServer{file: f, content: content}
			c := startFileServer(t, fs, remoting.ServerOptions{SendfileThreshold: threshold})
			_, err := c.Invoke(context.Background(), protocol.NewRequest(codeFile, map[string]string{"regions": "0:100,60000:40000"}, nil))
			require.ErrorIs(t, err, remoting.ErrConnClosed)
			require.Eventually(t, func() bool { return fs.released.Load() == 1 }, 5*time.Second, time.Millisecond)
		})
	}
}

// TestRespondWithFilesOutsideAHandler: a context that is not a Handler's refuses, so the
// caller copies.
func TestRespondWithFilesOutsideAHandler(t *testing.T) {
	resp := protocol.NewResponse(&protocol.Command{}, protocol.Success, "")
	assert.False(t, remoting.RespondWithFiles(context.Background(), resp, nil, func() { t.Error("released") }))
}
