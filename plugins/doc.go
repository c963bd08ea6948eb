// Package plugins runs flowd's WebAssembly plugins: message filters on the broker's read
// path, queue allocators for consumer groups, and message transforms. It implements the
// plugin ABI (ABI.md in this directory) on top of package runtime, validates plugin
// manifests, and keeps deployed plugins in a [Registry] that survives restarts and swaps the
// active version of a plugin at run time.
//
// # Calling a plugin
//
// [Filter], [Allocator] and [Transform] each follow the active version of a plugin (a
// [Registry]'s, or a [runtime.Slot]'s): every call borrows one instance of it, writes the batch into the guest's memory, makes one call
// and validates what the guest returned before anything uses it. Per-instance buffers are
// kept with [runtime.Instance.SetData], so a steady stream of calls allocates nothing on the
// host (a transform allocates its outputs).
//
// # Faults
//
// A trap, a time-out or memory growth past the limit is detected by package runtime. A guest
// error code ([ErrGuest]) or malformed output ([ErrBadOutput]) is detected here and handed to
// [runtime.Instance.Fault], so every fault takes one path: the instance is discarded, the
// fault counted under its [runtime.FaultKind], the manifest's policy applied with one restart
// budget. Callers get a [*runtime.FaultError] and branch with errors.Is on
// [runtime.ErrPolicyOpen] and [runtime.ErrPolicyClosed] whatever went wrong.
package plugins
