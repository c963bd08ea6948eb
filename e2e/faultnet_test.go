package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// faultNet carries the links between the members of a replica set (NATS routes, the
// replica-set stream) through TCP proxies the test controls, so that a node can be cut off
// from the others: each member's route listener and stream listener has a proxy in front,
// which every other member dials (routes, nats.cluster.advertise, replication.ha_advertise).
// A proxy tells which member dialled it by the socket's owner (/proc, Linux). Isolating a
// node blackholes every link it has, established or new: bytes are read and dropped, no
// connection is closed, as in a real partition; healing closes the blackholed ones, and new
// connections flow again. Clients (the test's sender, name-service queries) reach the
// members directly: an isolated master stays reachable to them and must refuse.
type faultNet struct {
	t        *testing.T
	mu       sync.Mutex
	pids     map[int]int // pid -> member id
	isolated map[int]bool
	links    []*link
	proxies  []net.Listener
}

// link is one proxied connection: from the member that dialled (0: not a member) to the
// member whose listener it reaches.
type link struct {
	from, to int
	a, b     net.Conn // b is nil for a connection accepted while cut (held, never forwarded)
	mu       sync.Mutex
	cut      bool
}

func (l *link) isCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

// close closes both ends; b under l.mu: serve sets it when the dial to the target returns,
// which may be while heal closes the link.
func (l *link) close() {
	l.a.Close()
	l.mu.Lock()
	b := l.b
	l.mu.Unlock()
	if b != nil {
		b.Close()
	}
}

func newFaultNet(t *testing.T) *faultNet {
	t.Helper()
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("partitions need /proc/net/tcp (Linux) to tell which member dialled a proxy")
	}
	f := &faultNet{t: t, pids: map[int]int{}, isolated: map[int]bool{}}
	t.Cleanup(f.close)
	return f
}

// setPid records the process of member id (after a start or a restart).
func (f *faultNet) setPid(id, pid int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, m := range f.pids {
		if m == id {
			delete(f.pids, p)
		}
	}
	f.pids[pid] = id
}

// proxy listens on a free loopback port and forwards to target, a listener of member to.
func (f *faultNet) proxy(to int, target string) string {
	f.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(f.t, err)
	f.mu.Lock()
	f.proxies = append(f.proxies, ln)
	f.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(to, target, c)
		}
	}()
	return ln.Addr().String()
}

func (f *faultNet) serve(to int, target string, c net.Conn) {
	l := &link{from: f.member(c), to: to, a: c}
	f.mu.Lock()
	cut := f.isolated[l.from] || f.isolated[l.to]
	l.cut = cut // l is not shared yet: isolate sees it only once appended
	f.links = append(f.links, l)
	f.mu.Unlock()
	if cut { // read from the local: isolate may set l.cut from here on
		go func() { _, _ = io.Copy(io.Discard, c) }() // held: what it sends is lost
		return
	}
	b, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	l.mu.Lock()
	l.b = b
	cut = l.cut
	l.mu.Unlock()
	if cut {
		b.Close()
	}
	go pipe(l, b, c)
	go pipe(l, c, b)
}

// pipe copies src to dst until either ends; while the link is cut, what arrives is dropped.
func pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !l.isCut() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if !l.isCut() {
		dst.Close()
		src.Close()
	}
}

// isolate cuts every link of member id, established or new.
func (f *faultNet) isolate(id int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.isolated[id] = true
	for _, l := range f.links {
		if l.from == id || l.to == id {
			l.mu.Lock()
			l.cut = true
			l.mu.Unlock()
		}
	}
}

// heal ends every partition: the blackholed links are closed (their ends see the
// connection go, as after a partition outlasting TCP's patience) and new ones flow.
func (f *faultNet) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.isolated = map[int]bool{}
	kept := f.links[:0]
	for _, l := range f.links {
		if l.isCut() {
			l.close()
			continue
		}
		kept = append(kept, l)
	}
	f.links = kept
}

func (f *faultNet) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ln := range f.proxies {
		ln.Close()
	}
	for _, l := range f.links {
		l.close()
	}
	f.links = nil
}

// member is the member whose process dialled c (0 if none): the socket at c's remote
// address belongs to one of the members' processes.
func (f *faultNet) member(c net.Conn) int {
	port := c.RemoteAddr().(*net.TCPAddr).Port
	inode := socketInode(port, c.LocalAddr().(*net.TCPAddr).Port)
	if inode == "" {
		return 0
	}
	f.mu.Lock()
	pids := make(map[int]int, len(f.pids))
	for p, id := range f.pids {
		pids[p] = id
	}
	f.mu.Unlock()
	want := "socket:[" + inode + "]"
	for pid, id := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name())); err == nil && l == want {
				return id
			}
		}
	}
	return 0
}

// socketInode finds, in /proc/net/tcp, the inode of the loopback socket bound to local
// port and connected to remote port.
func socketInode(local, remote int) string {
	file, err := os.Open("/proc/net/tcp")
	if err != nil {
		return ""
	}
	defer file.Close()
	want := fmt.Sprintf("0100007F:%04X", local)
	peer := fmt.Sprintf("0100007F:%04X", remote)
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 9 && fs[1] == want && fs[2] == peer {
			if _, err := strconv.Atoi(fs[9]); err == nil {
				return fs[9]
			}
		}
	}
	return ""
}
