// Package runtime hosts WebAssembly modules for flowd: it compiles them once (with a
// compilation cache on disk), keeps a bounded pool of instances per loaded module version,
// calls their exports under a memory cap and a time limit, applies a fault policy when a
// guest traps, times out or runs out of memory, and swaps module versions at run time.
//
// The package knows nothing of messages, brokers or plugin kinds. A plugin ABI is built on
// top of it: the ABI names the exports it requires ([Export]) and the version marker it
// expects ([ABI]), caches its function handles per instance ([Spec.Init], [Instance.SetData]),
// allocates guest memory through a guest export, writes a batch with [Instance.Memory], and
// makes one [Instance.Call] per batch.
//
// # Life of a module
//
//	rt, _ := runtime.New(ctx, runtime.Options{CacheDir: dataDir + "/wasm-cache"})
//	m, _ := rt.Load(ctx, runtime.Spec{Name: "filter", Wasm: bin, ...}) // validated, warmed
//	inst, _ := m.Borrow(ctx)                                           // waits if all are busy
//	err := inst.Call(ctx, inst.Function("flowd_filter"), stack)        // limited, classified
//	inst.Release()                                                     // a faulted one is discarded
//
// A [Slot] holds the active version of a module and swaps it without failing calls: calls
// borrowed from the old version complete on it, new ones go to the new version, and the old
// one is closed once its last instance came back.
//
// # Sandbox
//
// Guests get WASI (wasi_snapshot_preview1) because Go wasip1 guests cannot run without it,
// but no file system, no sockets, no arguments or environment, a fixed wall clock, a
// monotonic clock that advances only when read, sleeps that return at once and a
// deterministic random source. Their stdout and stderr go, line by line and rate-limited, to
// the runtime's [log/slog.Logger]. A module may import nothing but WASI and the host modules
// given in [Spec.Host]; anything else is refused when it is loaded, naming the import.
//
// # Time limits
//
// Every call into a guest is bounded, whatever the Spec says: by [Spec.CallTimeout]
// ([DefaultCallTimeout] when zero, at most [MaxCallTimeout]), and a guest's start and
// self-test by [Spec.StartTimeout]. Modules are compiled with wazero's checks for a done
// context, the only way to stop a guest that never returns: Go cannot preempt compiled
// guest code, so without them a looping guest would hold its goroutine for good and stall
// the whole process at the next garbage collection. The checks cost time per call and per
// loop iteration (RATIONALE.md).
//
// # Faults
//
// A call that traps ([ErrTrap]), outlives [Spec.CallTimeout] ([ErrTimeout]) or is refused
// memory past [Spec.MemoryLimitPages] ([ErrMemory]) returns a [*FaultError]; so does
// [Instance.Fault], through which the ABI on top reports what only it can see (malformed
// output, a guest error code). Every [FaultKind] takes one path: the instance is discarded,
// never reused, the fault is counted in [Stats].Faults, and the module's [Policy] decides
// what follows: [PolicyReload] replaces the instance within one restart budget,
// [PolicyFailOpen] and [PolicyFailClosed] stop the module, and later borrows return
// [ErrPolicyOpen] or [ErrPolicyClosed] so the caller knows whether to bypass the module or
// refuse the work. [FaultError].Stopped marks the one fault that stopped the module. A fault
// while [Runtime.Load] warms the module fails the load and applies no policy.
package runtime
