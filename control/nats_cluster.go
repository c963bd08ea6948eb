package control

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/flowd-io/flowd/internal/subjects"
)

// NATSClusterConfig joins the embedded server to a NATS cluster through routes. The zero
// value joins none: no route listener, a standalone server with standalone JetStream.
type NATSClusterConfig struct {
	// Name is the NATS cluster's name; every server of the cluster must have the same, and
	// a route between servers of different names is refused by NATS. A NATS subject token
	// (internal/subjects). Required with Listen; the daemon sets flowd's cluster name.
	Name string
	// Listen is the route listener's address, host:port (port 0 picks a free one). Empty
	// (the default) or "off": no cluster. A listener on anything but a loopback address needs User
	// and Password: Open refuses it otherwise (ErrInsecureListener).
	Listen string
	// Routes are the route URLs of the cluster's other servers, nats-route://host:port (a
	// server's own URL may be listed too: NATS skips it, so every node can share one
	// list). Needs Listen. None: this server is a seed the others route to (it routes to
	// itself, as JetStream needs a route; Listen then needs a port other than 0).
	Routes []string
	// User and Password authenticate routes: the route listener requires them, and routes
	// that carry no user of their own present them. Both or neither.
	User, Password string
	// Advertise, if set, is the route address (host:port) NATS gossips for this server
	// instead of the listener's: where the other servers reach it (NAT, a proxy).
	Advertise string
	// ProbeTimeout bounds the check Open makes of each route before the server starts: an
	// answer within it says whether the route leads to a NATS server of the same cluster.
	// Default 2 s.
	ProbeTimeout time.Duration
}

// ErrClusterNameMismatch: a route leads to a NATS server of another cluster name, so NATS
// would refuse the route for ever.
var ErrClusterNameMismatch = errors.New("NATS cluster names differ")

// enabled reports whether the configuration joins a cluster.
func (c *NATSClusterConfig) enabled() bool { return c.Listen != "" && c.Listen != "off" }

// ParseRoute checks a route URL: nats-route://[user:password@]host:port (nats:// is
// accepted too, as nats-server does), with a port in 1-65535 and nothing after it.
func ParseRoute(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w: %w", s, ErrBadConfig, err)
	}
	if u.Scheme != "nats-route" && u.Scheme != "nats" {
		return nil, fmt.Errorf("route %q: %w: the scheme must be nats-route://", s, ErrBadConfig)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("route %q: %w: want nats-route://host:port with a port in 1-65535", s, ErrBadConfig)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("route %q: %w: nothing may follow host:port", s, ErrBadConfig)
	}
	return u, nil
}

// clusterOptions sets the server's cluster options and routes from cfg.Cluster; Open
// probes the routes before the server starts.
func (n *NATS) clusterOptions(opts *server.Options) error {
	c := n.cfg.Cluster
	if !c.enabled() {
		if len(c.Routes) > 0 {
			return fmt.Errorf("nats: routes need a route listener (--nats-cluster-listen, NATSConfig.Cluster.Listen): %w", ErrBadConfig)
		}
		return nil
	}
	if n.cfg.Listen == "off" {
		// nats-server opens its route listener only once the client listener is up.
		return fmt.Errorf("nats: a route listener needs the client listener (--nats-listen, NATSConfig.Listen) on, not \"off\": %w", ErrBadConfig)
	}
	if err := subjects.Token(c.Name); err != nil {
		return fmt.Errorf("nats: cluster name (--nats-cluster-name, NATSConfig.Cluster.Name): %w: %w", ErrBadConfig, err)
	}
	if err := subjects.Token(n.cfg.ServerName); err != nil {
		return fmt.Errorf("nats: server name (--nats-server-name, NATSConfig.ServerName): %w: %w", ErrBadConfig, err)
	}
	if (c.User == "") != (c.Password == "") {
		return fmt.Errorf("nats: route authentication needs both a user and a password (--nats-cluster-user, --nats-cluster-password): %w", ErrBadConfig)
	}
	host, p, err := net.SplitHostPort(c.Listen)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port < 0 || port > 65535 {
		return fmt.Errorf("nats: cluster listen %q (--nats-cluster-listen): %w: want host:port with a port in 0-65535", c.Listen, ErrBadConfig)
	}
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as "no route listener"
	}
	if !isLoopback(host) && c.User == "" {
		return fmt.Errorf("nats: cluster listen %s: %w: set a route user and password (--nats-cluster-user, --nats-cluster-password; "+
			"NATSConfig.Cluster.User, Password), or listen on 127.0.0.1", c.Listen, ErrInsecureListener)
	}
	opts.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: port, Username: c.User, Password: c.Password, Advertise: c.Advertise}
	if len(c.Routes) == 0 {
		// JetStream in a cluster needs a route; a seed that the others route to routes to
		// itself, which NATS recognises and skips.
		if port == server.RANDOM_PORT {
			return fmt.Errorf("nats: a route listener on port 0 needs routes (--nats-routes, NATSConfig.Cluster.Routes): %w", ErrBadConfig)
		}
		u := &url.URL{Scheme: "nats-route", Host: seedHost(host, p)}
		if c.User != "" {
			u.User = url.UserPassword(c.User, c.Password)
		}
		opts.Routes = append(opts.Routes, u)
	}
	for _, r := range c.Routes {
		u, err := ParseRoute(r)
		if err != nil {
			return fmt.Errorf("nats: --nats-routes: %w", err)
		}
		if u.User == nil && c.User != "" {
			u.User = url.UserPassword(c.User, c.Password)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

// seedHost is where a seed reaches its own route listener.
func seedHost(host, port string) string {
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// probeRoutes checks every route once, at the same time, before the server starts. NATS
// retries a route for ever and says little about why it fails, so the mistakes that never
// mend are said here: a route to a server of another cluster name fails Open
// (ErrClusterNameMismatch); a server of the cluster that already has this server's name,
// or two that share one, fail it (ErrDuplicateServerName), since JetStream breaks on a
// name held twice; a NATS server answering on this server's own route URL fails it
// (ErrRouteListenerInUse); a route to a port that does not answer as a NATS server is
// logged as a warning naming it. A route that cannot be reached yet is normal while a
// cluster starts: NATS keeps trying it.
func (n *NATS) probeRoutes(ctx context.Context, routes []*url.URL) error {
	if len(n.cfg.Cluster.Routes) == 0 {
		return nil // a seed's one route is to itself
	}
	timeout := n.cfg.Cluster.ProbeTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	infos := make([]*routeInfo, len(routes))
	errs := make([]error, len(routes))
	var wg sync.WaitGroup
	for i, u := range routes {
		wg.Go(func() { infos[i], errs[i] = n.probeRoute(ctx, u, timeout) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return n.checkServerNames(routes, infos)
}

// ErrDuplicateServerName: a NATS server of the cluster already has this server's name, or
// two have one name; JetStream needs every server's name unique in the cluster.
var ErrDuplicateServerName = errors.New("NATS server names must be unique in a cluster")

// ErrRouteListenerInUse: a NATS server answers on this server's own route URL, so another
// process holds its route listener's port.
var ErrRouteListenerInUse = errors.New("the route listener's address is in use")

// serverNameHint says which settings give a node its NATS server name.
const serverNameHint = "every node needs its own broker_name (--broker-name), or nats.server_name (--nats-server-name, NATSConfig.ServerName)"

// checkServerNames refuses the start when a server answering a route has this server's
// name or answers on its own route URL, or when two servers answering share a name. infos
// holds what each route answered, nil when it did not answer as a NATS server.
func (n *NATS) checkServerNames(routes []*url.URL, infos []*routeInfo) error {
	own, cluster := n.cfg.ServerName, n.cfg.Cluster.Name
	var errs []error
	var ours []string                 // the routes of other servers named like this one
	byName := map[string][]*url.URL{} // the routes of every server, by its name
	ids := map[string]bool{}          // the server IDs seen
	for i, u := range routes {
		info := infos[i]
		if info == nil {
			continue
		}
		route := u.Redacted()
		if sameAddr(n.cfg.Cluster.Listen, u.Host) {
			// Our own listener is not up yet: whoever answers here is another process.
			errs = append(errs, fmt.Errorf("nats: route %s is this server's own route listener (nats.cluster.listen, --nats-cluster-listen), "+
				"but NATS server %q of cluster %q already answers there: %w; stop that process or move this node's route listener",
				route, info.Name, info.Cluster, ErrRouteListenerInUse))
			continue
		}
		if info.Name == own && !slices.Contains(ours, route) {
			ours = append(ours, route)
		}
		if info.ID != "" && ids[info.ID] {
			continue // the same server reached by another URL: one server, one name
		}
		ids[info.ID] = true
		byName[info.Name] = append(byName[info.Name], u)
	}
	if len(ours) > 0 {
		errs = append(errs, fmt.Errorf("nats: NATS server name %q is already in the cluster at %s: %w: %s",
			own, strings.Join(ours, ", "), ErrDuplicateServerName, serverNameHint))
	}
	names := slices.Sorted(maps.Keys(byName))
	for _, name := range names {
		if us := byName[name]; len(us) > 1 && name != own {
			var rs []string
			for _, u := range us {
				rs = append(rs, u.Redacted())
			}
			errs = append(errs, fmt.Errorf("nats: the NATS servers at %s of cluster %q all have the name %q: %w: %s",
				strings.Join(rs, ", "), cluster, name, ErrDuplicateServerName, serverNameHint))
		}
	}
	return errors.Join(errs...)
}

// sameAddr reports whether the route address hostport is the route listener listen: the
// same port, and the same host or loopback to a listener on every interface.
func sameAddr(listen, hostport string) bool {
	lh, lp, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	rh, rp, err := net.SplitHostPort(hostport)
	if err != nil || lp != rp || lp == "0" {
		return false
	}
	switch {
	case lh == rh:
		return true
	case lh == "" || lh == "0.0.0.0" || lh == "::":
		return isLoopback(rh)
	default:
		return isLoopback(lh) && isLoopback(rh) && (lh == "localhost" || rh == "localhost")
	}
}

// errNotNATS: the route's port answered, but not as a NATS server.
var errNotNATS = errors.New("does not answer as a NATS server")

// probeRoute returns what the route's server says of itself, nil when nothing answers as
// a NATS server; the error is a route to another cluster name.
func (n *NATS) probeRoute(ctx context.Context, u *url.URL, timeout time.Duration) (*routeInfo, error) {
	route := u.Redacted()
	info, err := remoteInfo(ctx, u.Host, timeout)
	switch {
	case errors.Is(err, errNotNATS):
		n.log.Warn("NATS route "+err.Error()+"; the server keeps trying it: check --nats-routes", "route", route)
	case err != nil:
		n.log.Info("NATS route not reachable yet; the server keeps trying it", "route", route, "err", err)
	case info.Cluster != n.cfg.Cluster.Name && !sameAddr(n.cfg.Cluster.Listen, u.Host):
		return nil, fmt.Errorf("nats: route %s leads to NATS cluster %q, but this server's cluster name (--nats-cluster-name, "+
			"NATSConfig.Cluster.Name) is %q: %w; give every node the same cluster name", route, info.Cluster, n.cfg.Cluster.Name, ErrClusterNameMismatch)
	default:
		n.log.Debug("NATS route answers", "route", route, "cluster", info.Cluster, "server", info.Name)
		return info, nil
	}
	return nil, nil
}

// routeInfo is what a NATS route listener says of its server in its INFO line.
type routeInfo struct {
	ID      string `json:"server_id"`
	Name    string `json:"server_name"`
	Cluster string `json:"cluster"`
}

// remoteInfo reads the INFO line a NATS route listener sends first.
func remoteInfo(ctx context.Context, hostport string, timeout time.Duration) (*routeInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", hostport, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() }) // unblocks the read
	defer stop()
	// A server's INFO holds its URLs, so it can be long; a line longer than this is no INFO.
	line, err := bufio.NewReaderSize(conn, 64<<10).ReadSlice('\n')
	if err != nil {
		return nil, fmt.Errorf("%w (no INFO line within %s: %v)", errNotNATS, timeout, err)
	}
	rest, ok := bytes.CutPrefix(line, []byte("INFO "))
	var info routeInfo
	if !ok || json.Unmarshal(bytes.TrimSpace(rest), &info) != nil {
		return nil, fmt.Errorf("%w (its first line is %q)", errNotNATS, truncate(string(line), 40))
	}
	return &info, nil
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// ClusterState is what the embedded server knows of its NATS cluster.
type ClusterState struct {
	// Clustered is false for a standalone server and when flowd connects to URLs (the
	// other fields are then empty, but for ServerName of a standalone server).
	Clustered bool
	// Name is the NATS cluster's name.
	Name string
	// ServerName is this server's name, unique in the cluster.
	ServerName string
	// RouteURL is this server's route listener, nats-route://host:port.
	RouteURL string
	// Routes are the names of the servers this one has a route to, sorted.
	Routes []string
	// MetaLeader is the name of the JetStream meta leader; empty while none is elected.
	MetaLeader string
	// Peers are the servers of the JetStream meta group, this one included, by name.
	Peers []ClusterPeer
}

// ClusterPeer is a server of the JetStream meta group.
type ClusterPeer struct {
	Name string
	// Current: seen recently and caught up. Offline: not seen recently.
	Current, Offline bool
}

// ClusterState reports the embedded server's routes and JetStream meta group.
func (n *NATS) ClusterState() (ClusterState, error) {
	if n.srv == nil {
		return ClusterState{}, nil
	}
	st := ClusterState{ServerName: n.srv.Name()}
	if !n.cfg.Cluster.enabled() {
		return st, nil
	}
	st.Clustered, st.Name = true, n.srv.ClusterName()
	if a := n.srv.ClusterAddr(); a != nil {
		st.RouteURL = "nats-route://" + a.String()
	}
	rz, err := n.srv.Routez(&server.RoutezOptions{})
	if err != nil {
		return st, fmt.Errorf("nats: routes: %w", err)
	}
	for _, r := range rz.Routes {
		if r.RemoteName != "" && !slices.Contains(st.Routes, r.RemoteName) {
			st.Routes = append(st.Routes, r.RemoteName)
		}
	}
	slices.Sort(st.Routes)
	jz, err := n.srv.Jsz(&server.JSzOptions{})
	if err != nil {
		return st, fmt.Errorf("nats: JetStream: %w", err)
	}
	if m := jz.Meta; m != nil {
		st.MetaLeader = m.Leader
		st.Peers = append(st.Peers, ClusterPeer{Name: st.ServerName, Current: true})
		for _, p := range m.Replicas {
			st.Peers = append(st.Peers, ClusterPeer{Name: p.Name, Current: p.Current, Offline: p.Offline})
		}
		slices.SortFunc(st.Peers, func(a, b ClusterPeer) int { return strings.Compare(a.Name, b.Name) })
	}
	return st, nil
}

// logCluster says, once the server started, which cluster it joined and through what.
func (n *NATS) logCluster(opts *server.Options) {
	if !n.cfg.Cluster.enabled() {
		return
	}
	routes := make([]string, 0, len(opts.Routes))
	for _, u := range opts.Routes {
		routes = append(routes, u.Redacted())
	}
	st, _ := n.ClusterState() // the routes and meta leader come later; the names are known
	n.log.Info("NATS cluster", "name", st.Name, "server", st.ServerName, "route_listen", st.RouteURL,
		"routes", strings.Join(routes, ","), "route_auth", n.cfg.Cluster.User != "")
}

// clusterNameHint is added to NATS's own report of a route refused for its cluster name,
// which can happen after start too (a node restarted with another name).
const clusterNameHint = "every node of a NATS cluster needs the same cluster name (--nats-cluster-name)"

// isClusterNameConflict recognises nats-server's log line for a route refused because
// the cluster names differ.
func isClusterNameConflict(msg string) bool {
	return strings.Contains(msg, "cluster name") && strings.Contains(msg, "does not match")
}
