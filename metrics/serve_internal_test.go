package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// serve answers until its context ends, then shuts down and returns nil.
func TestServeShutsDownWhenTheContextEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, ln, NewHandler(New(Options{}).Registry(), nil)) }()

	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "ok\n", string(body))

	resp, err = http.Get("http://" + ln.Addr().String() + "/metrics")
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "go_goroutines", "the runtime collectors are registered")

	cancel()
	require.NoError(t, <-done)
	_, err = http.Get("http://" + ln.Addr().String() + "/healthz")
	require.Error(t, err, "the listener is closed")
}

// Serve reports an address it cannot listen on.
func TestServeFailsOnABadAddress(t *testing.T) {
	err := Serve(t.Context(), "127.0.0.1:-1", http.NotFoundHandler())
	require.ErrorContains(t, err, "metrics: listen")
}
