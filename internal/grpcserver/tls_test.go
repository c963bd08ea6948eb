package grpcserver_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/internal/grpcserver"
	pb "github.com/flowd-io/flowd/internal/rocketmqv2"
)

// selfSigned is a certificate for 127.0.0.1 made for the test.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "flowd test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	leaf, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestTLSEndpointServesTLSOnly(t *testing.T) {
	b, err := broker.New(broker.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", NamesrvListen: "off", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	cert, pool := selfSigned(t)
	srv, err := grpcserver.New(grpcserver.Config{Broker: b, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv.Serve(ln)
	t.Cleanup(func() {
		ctx := callCtx(t, "x")
		require.NoError(t, srv.Shutdown(ctx))
		require.NoError(t, b.Shutdown(ctx))
	})
	e := &env{b: b}
	e.topic(t, "secure", 1)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool})))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := pb.NewMessagingServiceClient(conn).QueryRoute(callCtx(t, "c"), &pb.QueryRouteRequest{Topic: res("secure")})
	require.NoError(t, err)
	require.Equal(t, pb.Code_OK, resp.Status.Code)

	plain, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer plain.Close()
	_, err = pb.NewMessagingServiceClient(plain).QueryRoute(callCtx(t, "c"), &pb.QueryRouteRequest{Topic: res("secure")})
	require.Error(t, err, "a plaintext client is refused")
}
