package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// The daemon serves the RocketMQ 5 endpoint on listen.grpc over its broker, and its calls
// show in /metrics.
func TestServeRunsTheGRPCEndpoint(t *testing.T) {
	d := startServed(t, "")
	m := regexp.MustCompile(`http=(\S+) grpc=(\S+)`).FindStringSubmatch(d.logs.String())
	require.NotNil(t, m, d.logs.String())
	httpAddr, grpcAddr := m[1], m[2]
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-mq-client-id", "serve-test")
	resp, err := pb.NewMessagingServiceClient(conn).QueryRoute(ctx, &pb.QueryRouteRequest{Topic: &pb.Resource{Name: "missing"}})
	require.NoError(t, err)
	require.Equal(t, pb.Code_TOPIC_NOT_FOUND, resp.Status.Code)

	r, err := http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `flowd_grpc_requests_total{code="TOPIC_NOT_FOUND",rpc="QueryRoute"} 1`)
	require.Contains(t, string(body), "flowd_grpc_clients 0")
}
