package main

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listen address another process holds makes serve fail, naming the setting and the flag
// that move the listener, and how to turn it off when it can be: for every listener the
// daemon opens.
func TestServeNamesTheSettingOfATakenAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	taken := ln.Addr().String()
	cases := map[string]struct {
		flag, want string
	}{
		"broker":       {"--listen", "listen broker " + taken + ": address already in use (set listen.broker / --listen to another address)"},
		"name service": {"--namesrv-listen", "listen name service " + taken + ": address already in use (set listen.namesrv / --namesrv-listen to another address, or --namesrv-listen off to disable it)"},
		"NATS":         {"--nats-listen", "listen NATS " + taken + ": address already in use (set nats.listen / --nats-listen to another address, or --nats-listen off to disable it)"},
		"NATS cluster": {"--nats-cluster-listen", "listen NATS cluster " + taken + ": address already in use (set nats.cluster.listen / --nats-cluster-listen to another address)"},
		"gRPC":         {"--grpc-listen", "listen gRPC " + taken + ": address already in use (set listen.grpc / --grpc-listen to another address, or --grpc-listen off to disable it)"},
		"HTTP":         {"--http-listen", "listen HTTP " + taken + ": address already in use (set http.listen / --http-listen to another address, or --http-listen off to disable it)"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			args := map[string]string{"--listen": "127.0.0.1:0", "--namesrv-listen": "127.0.0.1:0", "--nats-listen": "127.0.0.1:0", "--http-listen": "127.0.0.1:0", "--grpc-listen": "127.0.0.1:0"}
			args[c.flag] = taken
			cmd := []string{"serve", "--data-dir", t.TempDir()}
			for f, v := range args {
				cmd = append(cmd, f, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var logs syncBuffer
			err := run(ctx, cmd, &logs, &logs)
			require.Error(t, err, "serve started on a taken address: %s", logs.String())
			assert.ErrorIs(t, err, syscall.EADDRINUSE)
			assert.Contains(t, err.Error(), c.want)
			assert.NotContains(t, logs.String(), "flowd serving")
		})
	}
}
