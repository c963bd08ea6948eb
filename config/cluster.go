package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"

	"github.com/flowd-io/flowd/internal/subjects"
)

// NATSCluster joins the embedded NATS server to a NATS cluster through routes. Left
// empty, the server is standalone, as it always was.
type NATSCluster struct {
	Name     string   `yaml:"name" env:"FLOWD_NATS_CLUSTER_NAME" flag:"nats-cluster-name" doc:"NATS cluster name, the same on every node (a NATS subject token); empty: the flowd cluster name"`
	Listen   string   `yaml:"listen" env:"FLOWD_NATS_CLUSTER_LISTEN" flag:"nats-cluster-listen" doc:"route listener address (host:port); empty: no cluster; a non-loopback one needs user and password"`
	Routes   []string `yaml:"routes" env:"FLOWD_NATS_ROUTES" flag:"nats-routes" doc:"route URLs of the cluster's nodes, nats-route://host:port, this node's own may be listed (env and flag: comma-separated); none: the others route to this node"`
	User     string   `yaml:"user" env:"FLOWD_NATS_CLUSTER_USER" flag:"nats-cluster-user" doc:"user that routes authenticate with; the route listener requires it"`
	Password string   `yaml:"password" env:"FLOWD_NATS_CLUSTER_PASSWORD" flag:"nats-cluster-password" doc:"password of the route user"`
	// Advertise is NATS's cluster advertise: the address other servers learn this one by
	// when NATS gossips the cluster's routes (behind NAT, a proxy, a container port map).
	Advertise string `yaml:"advertise" env:"FLOWD_NATS_CLUSTER_ADVERTISE" flag:"nats-cluster-advertise" doc:"route address (host:port) the other servers are told to reach this one at; empty: the route listener's"`
}

// natsClusterProblems checks the cluster settings here, the same way the control plane
// does at start, so that config validate names them.
func (c Config) natsClusterProblems() []Problem {
	var probs []Problem
	bad := func(key, format string, args ...any) {
		probs = append(probs, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	nc := c.NATS.Cluster
	if c.NATS.ServerName != "" {
		if err := subjects.Token(c.NATS.ServerName); err != nil {
			bad("nats.server_name", "%v", err)
		}
	}
	if nc.Name != "" {
		if err := subjects.Token(nc.Name); err != nil {
			bad("nats.cluster.name", "%v", err)
		}
	}
	switch {
	case nc.User == "" && nc.Password != "":
		bad("nats.cluster.user", "must be set with nats.cluster.password")
	case nc.User != "" && nc.Password == "":
		bad("nats.cluster.password", "must be set with nats.cluster.user")
	}
	if nc.Advertise != "" {
		if err := checkListen(nc.Advertise); err != nil {
			bad("nats.cluster.advertise", "%q %v", nc.Advertise, err)
		}
	}
	for i, r := range nc.Routes {
		if err := checkRoute(r); err != nil {
			bad(fmt.Sprintf("nats.cluster.routes[%d]", i), "%q %v", r, err)
		}
	}
	if nc.Listen == "" {
		if len(nc.Routes) > 0 {
			bad("nats.cluster.routes", "routes need a route listener: set nats.cluster.listen")
		}
		return probs
	}
	if len(c.NATS.URLs) > 0 {
		bad("nats.cluster.listen", "applies to the embedded server, which nats.urls replaces")
		return probs
	}
	if c.NATS.Listen == "off" {
		bad("nats.cluster.listen", `needs the client listener: nats.listen cannot be "off" in a cluster`)
	}
	if c.NATS.ServerName == "" {
		if err := subjects.Token(c.BrokerName); err != nil {
			bad("broker_name", "%v (it names the NATS server in a cluster: set nats.server_name)", err)
		}
	}
	host, port, err := net.SplitHostPort(nc.Listen)
	if err != nil {
		return probs // addrProblems names it
	}
	if !loopback(host) && nc.User == "" {
		bad("nats.cluster.listen", "%q is not a loopback address: set nats.cluster.user and nats.cluster.password, as every node's routes must present them", nc.Listen)
	}
	if port == "0" && len(nc.Routes) == 0 {
		bad("nats.cluster.listen", "port 0 needs nats.cluster.routes: the other nodes cannot route to a port chosen at start")
	}
	return probs
}

// checkRoute checks a route URL: nats-route://[user:password@]host:port.
func checkRoute(r string) error {
	u, err := url.Parse(r)
	if err != nil || (u.Scheme != "nats-route" && u.Scheme != "nats") {
		return fmt.Errorf("is not a route URL, nats-route://host:port")
	}
	host, port, err := net.SplitHostPort(u.Host)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return fmt.Errorf("is not nats-route://host:port with a port in 1-65535")
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("has something after host:port")
	}
	return nil
}

// loopback reports whether host is a loopback address (or localhost).
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
