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
type procSample struct {
	cpu          time.Duration
	vol, nonvol  int64
	taskFailures int // threads that ended while being read: their counts are missing
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
				s.taskFailures++
				continue
			}
			return procSample{}, err
		}
	}
	return s, nil
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
	return procSample{cpu: s.cpu - o.cpu, vol: s.vol - o.vol, nonvol: s.nonvol - o.nonvol, taskFailures: s.taskFailures + o.taskFailures}
}

// window measures a scenario's timed section in two processes: this one, where the clients
// run, and the server's (a `flowd serve` or JetStream child). A nil window measures nothing,
// as in an in-process run, where one process holds both sides and no split is to be had.
type window struct {
	server      int // the server's pid
	client, srv procSample
	err         error
}

// newWindow is a window on server's process, or nil when there is none (pid 0).
func newWindow(server int) *window {
	if server == 0 {
		return nil
	}
	return &window{server: server}
}

// begin samples both processes at the start of the timed section.
func (w *window) begin() {
	if w == nil {
		return
	}
	var errC, errS error
	w.client, errC = readProc(0)
	w.srv, errS = readProc(w.server)
	w.err = errors.Join(errC, errS)
}

// end samples both processes again and keeps what the section used.
func (w *window) end() {
	if w == nil || w.err != nil {
		return
	}
	client, errC := readProc(0)
	srv, errS := readProc(w.server)
	if w.err = errors.Join(errC, errS); w.err == nil {
		w.client, w.srv = client.sub(w.client), srv.sub(w.srv)
	}
}

// procCost is a process's share of a scenario per message: CPU time in microseconds and
// context switches.
type procCost struct {
	cpuUS, ctxsw float64
}

// perMessage is what the window's section cost each process per message.
func (w *window) perMessage(messages int) (client, server procCost) {
	if w == nil || w.err != nil || messages < 1 {
		return procCost{}, procCost{}
	}
	per := func(s procSample) procCost {
		return procCost{cpuUS: float64(s.cpu.Nanoseconds()) / 1e3 / float64(messages), ctxsw: float64(s.vol+s.nonvol) / float64(messages)}
	}
	return per(w.client), per(w.srv)
}

// addCosts sets a result's per-process figures: flowd's client and broker from fw, the
// baseline's client and server from bw, and the ratio of the totals when both are known.
func (r *benchResult) addCosts(fw *window, bw *window, messages int) {
	fc, fs := fw.perMessage(messages)
	bc, bs := bw.perMessage(messages)
	r.ClientCPU, r.ClientCtxSwitches, r.BrokerCPU, r.BrokerCtxSwitches = fc.cpuUS, fc.ctxsw, fs.cpuUS, fs.ctxsw
	r.BaselineClientCPU, r.BaselineClientCtxSwitches = bc.cpuUS, bc.ctxsw
	r.BaselineServerCPU, r.BaselineServerCtxSwitches = bs.cpuUS, bs.ctxsw
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
