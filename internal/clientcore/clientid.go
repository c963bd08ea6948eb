package clientcore

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strconv"
)

// DefaultInstanceName returns the instance name a Client takes when none is given: the process
// id followed by a random suffix, "12345#9f1c2a7b".
//
// # Notes
//
// RocketMQ uses the bare pid, which makes every client of a process share one client id: its
// clients are singletons per instance name, so that is harmless there. flowd's clients are
// not, and two consumers of one group in one process must be two members, so the suffix makes
// every default name unique.
func DefaultInstanceName() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return strconv.Itoa(os.Getpid()) + "#" + hex.EncodeToString(b[:])
}

// LocalIP returns the first non-loopback IPv4 address of an up interface, or "127.0.0.1"
// when there is none. It only labels the client id (and producer message ids): nothing
// connects to it.
//
// # Notes
//
// It only lists the host's interfaces. Unlike the common trick of "dialing" a public address
// over UDP to learn the outgoing interface, it sends nothing and resolves nothing, so a test
// that starts a client on a host without network access never leaves the loopback interface.
func LocalIP() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "127.0.0.1"
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip4 := ipn.IP.To4(); ip4 != nil && !ip4.IsLoopback() && !ip4.IsLinkLocalUnicast() {
					return ip4.String()
				}
			}
		}
	}
	return "127.0.0.1"
}
