//go:build !flowdpop

package grpcserver_test

import "testing"

func benchPopAck(b *testing.B, _ []byte) { b.Skip("pop consumption is not built in (flowdpop)") }
