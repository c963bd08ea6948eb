package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// procSample is what the kernel has counted of one process at one moment: the CPU time of
// its threads (user and system) and their context switches, voluntary (a thread blocked: a
// futex wait, a read with nothing to read) and not (it was preempted).
//
// syscr and syscw count its read and write system calls (/proc/<pid>/io: read, readv,
// recvmsg…, write, writev, sendfile…), the socket I/O a message costs; futex and epoll waits
// are not among them.
type procSample struct {
	cpu          time.Duration
	vol, nonvol  int64
	syscr, syscw int64
}

// readProc samples process pid (0: this one) from /proc. The CPU time is the sum of its
// threads' run time in /proc/<pid>/task/<tid>/schedstat, in nanoseconds: utime + stime of
// /proc/<pid>/stat count the same time in clock ticks of 10 ms, too coarse for a scenario
// of a few thousand messages. A Go process's threads live as long as it does, so the sum
// misses nothing a thread's end would take with it.
func readProc(pid int) (procSample, error) {
	dir := "/proc/self"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid)
	}
	tasks, err := filepath.Glob(filepath.Join(dir, "task", "*"))
	if err != nil || len(tasks) == 0 {
		return procSample{}, fmt.Errorf("bench: threads of %s: %w", dir, cmpOr(err, os.ErrNotExist))
	}
	var s procSample
	for _, task := range tasks {
		if err := s.addTask(task); err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, errTaskGone) {
				continue // the thread ended while being read
			}
			return procSample{}, err
		}
	}
	if err := s.addIO(filepath.Join(dir, "io")); err != nil {
		return procSample{}, err
	}
	return s, nil
}

// addIO reads the process's read and write system call counts.
func (s *procSample) addIO(file string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	for line := range strings.Lines(string(raw)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case err != nil:
		case k == "syscr":
			s.syscr = n
		case k == "syscw":
			s.syscw = n
		}
	}
	return nil
}

// errTaskGone is a thread's file read empty: it ended while being read.
var errTaskGone = errors.New("thread ended")

// addTask adds one thread's run time and context switches.
func (s *procSample) addTask(task string) error {
	raw, err := os.ReadFile(filepath.Join(task, "schedstat"))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	f := strings.Fields(string(raw))
	if len(f) == 0 {
		return errTaskGone
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return fmt.Errorf("bench: %s/schedstat: %w", task, err)
	}
	status, err := os.ReadFile(filepath.Join(task, "status"))
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch {
		case err != nil:
		case k == "voluntary_ctxt_switches":
			s.vol += n
		case k == "nonvoluntary_ctxt_switches":
			s.nonvol += n
		}
	}
	s.cpu += time.Duration(ns)
	return nil
}

func (s procSample) sub(o procSample) procSample {
	return procSample{cpu: s.cpu - o.cpu, vol: s.vol - o.vol, nonvol: s.nonvol - o.nonvol,
		syscr: s.syscr - o.syscr, syscw: s.syscw - o.syscw}
}

// window measures a scenario's timed section in this process, where the clients run, and in
// the server's (a `flowd serve` or JetStream child) when there is one; in an in-process run
// (server 0) this one process holds both sides, and its figures are the sum.
type window struct {
	server      int // the server's pid; 0: none, the server runs in this process
	client, srv procSample
	err         error
}

func newWindow(server int) *window { return &window{server: server} }

// sample reads both processes; the server's is zero when it is this one.
func (w *window) sample() (client, srv procSample, err error) {
	client, err = readProc(0)
	if w.server != 0 && err == nil {
		srv, err = readProc(w.server)
	}
	return client, srv, err
}

// begin samples at the start of the timed section; a nil window measures nothing.
func (w *window) begin() {
	if w != nil {
		w.client, w.srv, w.err = w.sample()
	}
}

// end samples again and keeps what the section used.
func (w *window) end() {
	if w == nil || w.err != nil {
		return
	}
	client, srv, err := w.sample()
	if w.err = err; err == nil {
		w.client, w.srv = client.sub(w.client), srv.sub(w.srv)
	}
}

// procCost is a process's share of a scenario per message: CPU time in microseconds,
// context switches, and read and write system calls.
type procCost struct {
	cpuUS, ctxsw, rw float64
}

// perMessage is what the window's section cost each process per message.
func (w *window) perMessage(messages int) (client, server procCost) {
	if w == nil || w.err != nil || messages < 1 {
		return procCost{}, procCost{}
	}
	per := func(s procSample) procCost {
		n := float64(messages)
		return procCost{cpuUS: float64(s.cpu.Nanoseconds()) / 1e3 / n, ctxsw: float64(s.vol+s.nonvol) / n, rw: float64(s.syscr+s.syscw) / n}
	}
	return per(w.client), per(w.srv)
}

// addCosts sets a result's per-process figures: flowd's client and broker from fw, the
// baseline's client and server from bw, and the ratio of the totals when both are known.
//
// In an in-process run there is one process: its figures are ProcessCPU and
// BaselineProcessCPU.
func (r *benchResult) addCosts(fw *window, bw *window, messages int) {
	fc, fs := fw.perMessage(messages)
	bc, bs := bw.perMessage(messages)
	if fw != nil && fw.server == 0 {
		r.ProcessCPU, r.BaselineProcessCPU = fc.cpuUS, bc.cpuUS
		if fc.cpuUS > 0 && bc.cpuUS > 0 {
			r.CPURatio = fc.cpuUS / bc.cpuUS
		}
		return
	}
	r.ClientCPU, r.ClientCtxSwitches, r.BrokerCPU, r.BrokerCtxSwitches = fc.cpuUS, fc.ctxsw, fs.cpuUS, fs.ctxsw
	r.BaselineClientCPU, r.BaselineClientCtxSwitches = bc.cpuUS, bc.ctxsw
	r.BaselineServerCPU, r.BaselineServerCtxSwitches = bs.cpuUS, bs.ctxsw
	r.ClientSyscalls, r.BrokerSyscalls, r.BaselineClientSyscalls, r.BaselineServerSyscalls = fc.rw, fs.rw, bc.rw, bs.rw
	if f, b := fc.cpuUS+fs.cpuUS, bc.cpuUS+bs.cpuUS; f > 0 && b > 0 {
		r.CPURatio = f / b
	}
}

// windowErr is the first error of the windows that measured something.
func windowErr(ws ...*window) error {
	var errs []error
	for _, w := range ws {
		if w != nil && w.err != nil {
			errs = append(errs, w.err)
		}
	}
	return errors.Join(errs...)
}

// consumeResult is a consuming scenario's result: flowd's rate next to JetStream's, with
// the costs its processes' windows measured over n messages.
func consumeResult(sc benchScenario, rate, jsRate float64, fw, jw *window, n int) ([]benchResult, error) {
	if err := windowErr(fw, jw); err != nil {
		return nil, err
	}
	res := newResult(sc.name, "msg/s", rate, "jetstream", jsRate)
	res.Size = sc.size
	res.addCosts(fw, jw, n)
	return []benchResult{res}, nil
}
