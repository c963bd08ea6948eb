package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
)

// addrSetting is an address the daemon binds and the setting it comes from, so that a
// failure to bind it can say what to change.
type addrSetting struct {
	what, key, addr string
	// optional: the setting takes "off" to open no listener.
	optional bool
}

// brokerAddrs are the addresses broker.New binds, in its order.
func brokerAddrs(c config.Config) []addrSetting {
	out := []addrSetting{{what: "broker", key: "listen.broker", addr: c.Listen.Broker}}
	if c.Listen.Namesrv != "off" {
		out = append(out, addrSetting{what: "name service", key: "listen.namesrv", addr: c.Listen.Namesrv, optional: true})
	}
	return out
}

func natsAddr(c config.Config) addrSetting {
	return addrSetting{what: "NATS", key: "nats.listen", addr: c.NATS.Listen, optional: true}
}

func natsClusterAddr(c config.Config) addrSetting {
	return addrSetting{what: "NATS cluster", key: "nats.cluster.listen", addr: c.NATS.Cluster.Listen}
}

// natsCluster maps the cluster settings onto the control plane's: the NATS cluster is
// named after flowd's cluster and, in a cluster, the server after the broker (after the
// replica-set member, broker name and id, with replication on), unless set.
func natsCluster(c config.Config) (serverName string, cl control.NATSClusterConfig) {
	nc := c.NATS.Cluster
	cl = control.NATSClusterConfig{Name: nc.Name, Listen: nc.Listen, Routes: nc.Routes, User: nc.User, Password: nc.Password, Advertise: nc.Advertise}
	if cl.Name == "" {
		cl.Name = c.Cluster
	}
	serverName = c.NATS.ServerName
	if serverName == "" && nc.Listen != "" {
		serverName = c.BrokerName
		if c.Replication.Enabled() {
			serverName = replicaNode(c)
		}
	}
	return serverName, cl
}

func httpAddr(c config.Config) addrSetting {
	return addrSetting{what: "HTTP", key: "http.listen", addr: c.HTTP.Listen, optional: true}
}

// listenError is err, a failure to bind a's address, saying which setting and flag move the
// listener (or turn it off): "listen broker 127.0.0.1:10911: address already in use (set
// listen.broker / --listen to another address)".
func listenError(a addrSetting, err error) error {
	flag := ""
	def := config.Default()
	for _, st := range config.Settings(&def) {
		if st.Key == a.key {
			flag = st.Flag
		}
	}
	hint := "set " + a.key + " / --" + flag + " to another address"
	if a.optional {
		hint += ", or --" + flag + " off to disable it"
	}
	cause := err
	var oe *net.OpError
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		cause = syscall.EADDRINUSE
	case errors.As(err, &oe):
		cause = oe.Err // "bind: permission denied": the address is said already
	}
	return fmt.Errorf("serve: listen %s %s: %w (%s)", a.what, a.addr, cause, hint)
}

// listen binds a's address.
func listen(ctx context.Context, a addrSetting) (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a.addr)
	if err != nil {
		return nil, listenError(a, err)
	}
	return ln, nil
}

// takenAddr tells which of addrs cannot be bound, once a component failed to bind one of
// them: the broker's and the NATS server's errors name the address but not the setting,
// and the NATS server's is only text. It returns nil when all can be bound now.
func takenAddr(ctx context.Context, addrs ...addrSetting) error {
	for _, a := range addrs {
		ln, err := listen(ctx, a)
		if err != nil {
			return err
		}
		_ = ln.Close()
	}
	return nil
}

// brokerListenError is err of broker.New, or the listen error naming the setting when it
// failed to bind one of its addresses.
func brokerListenError(ctx context.Context, c config.Config, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "listen" {
		if lerr := takenAddr(ctx, brokerAddrs(c)...); lerr != nil {
			return lerr
		}
	}
	return err
}

// natsListenError is err of starting the control plane, or the listen error naming the
// setting when the embedded server could not bind its address. A configuration the
// control plane refused before listening keeps its own error.
func natsListenError(ctx context.Context, c config.Config, err error) error {
	if len(c.NATS.URLs) > 0 || errors.Is(err, control.ErrBadConfig) || errors.Is(err, control.ErrInsecureListener) ||
		errors.Is(err, control.ErrClusterNameMismatch) || errors.Is(err, control.ErrDuplicateServerName) ||
		errors.Is(err, control.ErrRouteListenerInUse) {
		return err
	}
	var addrs []addrSetting
	if c.NATS.Listen != "off" {
		addrs = append(addrs, natsAddr(c))
	}
	if c.NATS.Cluster.Listen != "" {
		addrs = append(addrs, natsClusterAddr(c))
	}
	if lerr := takenAddr(ctx, addrs...); lerr != nil {
		return lerr
	}
	return err
}
