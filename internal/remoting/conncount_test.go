package remoting_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/internal/remoting"
)

// ConnCount follows connections as they open and close.
func TestServerConnCountFollowsConnections(t *testing.T) {
	s := startServer(t, newTestHandler(), remoting.ServerOptions{})
	require.Zero(t, s.ConnCount())
	a := dial(t, s.addr, remoting.ClientOptions{})
	dial(t, s.addr, remoting.ClientOptions{})
	require.Eventually(t, func() bool { return s.ConnCount() == 2 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, a.Close())
	require.Eventually(t, func() bool { return s.ConnCount() == 1 }, 5*time.Second, 5*time.Millisecond)
}
